"""Client policies: ``policies/*.toml`` (one file per client) -> a frozen ``PolicySet``.

Three jobs, one module each: ``schema`` (what a policy file may say), ``identity`` (who a
request is: keys, labels, the key rule, prompt-cache partitions) and ``files`` (reading and
validating a directory of policy files). Import from here.
"""

from router.config.policies.files import (
    MAX_POLICY_FILE_BYTES,
    PolicyFiles,
    load_policies,
    parse_policies,
    read_policy_files,
)
from router.config.policies.identity import (
    Identity,
    PolicySet,
    Unauthorized,
    bearer_token,
    key_digest,
    mask_key,
)
from router.config.policies.schema import (
    DEFAULT_CLIENT,
    NAME_PATTERN,
    Caps,
    MatchRules,
    ModelRules,
    Policy,
    PolicyError,
    Via,
)

__all__ = [
    "DEFAULT_CLIENT",
    "MAX_POLICY_FILE_BYTES",
    "NAME_PATTERN",
    "Caps",
    "Identity",
    "MatchRules",
    "ModelRules",
    "Policy",
    "PolicyError",
    "PolicyFiles",
    "PolicySet",
    "Unauthorized",
    "Via",
    "bearer_token",
    "key_digest",
    "load_policies",
    "mask_key",
    "parse_policies",
    "read_policy_files",
]
