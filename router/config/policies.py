"""Client policies: ``policies/*.toml`` (one file per client) -> a frozen ``PolicySet``.

Who a request is (``PolicySet.identify``), in this order of precedence:

1. an API key (``Authorization: Bearer ...``) listed by a policy: the key is proof;
2. the ``X-Speclane-Client`` header, compared case-insensitively;
3. the ``User-Agent``, against each policy's regular expressions (``re.search``), policies
   taken in file-name order, first match wins;
4. the ``default`` policy (``policies/default.toml``; when there is none, an implied
   permissive default: no key required, overrides allowed, no concurrency limit).

The key rule (``PolicySet.admits_without_key``, also what ``serve``'s exposure warning
asks): a header or user agent never opens what the default keeps closed. Without a valid
key a request is served only when the default serves requests without a key, and never
under a policy that requires one. (On an open router a label still selects a key-less
policy, with its lanes, presets and priority: that is what labels are for.)

- ``require_api_key = true`` on the default closes the router: every request needs some
  valid key (any policy's); the header and user agent are then ignored, so naming a
  key-less policy or sending its user agent opens nothing.
- ``require_api_key = true`` on another policy: that policy is used only with one of its
  keys. A header or user agent that points at it without the key is treated like an
  unknown name (the request falls back to the default), so a probe cannot tell a name that
  exists and needs a key from a name that does not exist: both are answered alike.
- An unknown key on an open router is ignored (OpenAI SDKs always send some key) and
  recognition goes on with steps 2-4; on a closed one it is a 401 (``invalid_api_key``). A
  ``Bearer`` value that is not valid UTF-8 can be no key: always 401.

``priority``: higher is more important (llm-d's direction); 0 is normal and negative is
sheddable. It is the claim on the one-request-at-a-time speculative lane: above 0 the
request takes that lane whenever the lane itself is free, even while the load gate says the
machine is busy; below 0 it takes it only while both lanes are idle.

``caps`` are limits on request parameters. ``action = "clamp"`` (the default) lowers the
value and says so in ``X-Speclane-Decision`` (``clamped=max_tokens``); ``"reject"`` answers
400. A ``max_tokens`` cap also applies when the request sets no ``max_tokens`` (the lanes
would otherwise generate until EOS or the end of the context), and the decision header then
says ``max_tokens_cap=<n>``: the guard against a small model looping on an agent's request.

Prompt-cache partitions (``PolicySet.cache_partition``): a lane reuses the KV state of an
earlier prompt only for a request of the same partition, so that ``cached_tokens`` and the
time to the first token never tell one client what another has sent. A request identified
by one of a policy's keys is in that policy's partition, or in the ``cache_group`` it names
(policies naming the same group share their cache entries); every other request (identified
by ``X-Speclane-Client``, User-Agent, or nothing: labels prove nothing) is in the default
policy's partition.

API keys are given inline (``api_keys``) or by environment variable name (``api_key_env``,
preferred). They are kept as SHA-256 digests for lookup and shown only as ``key#<8 hex>``
or ``$NAME``; no message or table prints a key.
"""

from __future__ import annotations

import hashlib
import os
import re
import tomllib
from collections.abc import Collection, Iterator, Mapping
from dataclasses import dataclass, field
from fnmatch import fnmatchcase
from pathlib import Path
from typing import Any, Literal

from pydantic import (
    Field,
    SecretStr,
    ValidationError,
    field_validator,
    model_validator,
)

from router.config.base import Frozen, validation_problems
from router.config.presets import LanePreference, PresetSpec
from router.config.speculation import SpecOverrides, SpecSettings

DEFAULT_CLIENT = "default"
NAME_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$"  # also a metrics label value

Via = Literal["api_key", "client_header", "user_agent", "default"]


def _one_or_many(value: Any) -> Any:
    return (value,) if isinstance(value, str | SecretStr) else value


class MatchRules(Frozen):
    """How to recognise the client; any one rule is enough."""

    api_keys: tuple[SecretStr, ...] = ()
    api_key_env: tuple[str, ...] = ()
    client_header: tuple[str, ...] = ()
    user_agent: tuple[str, ...] = ()  # regular expressions, re.search

    _listify = field_validator("api_keys", "api_key_env", "client_header", "user_agent",
                               mode="before")(_one_or_many)

    @field_validator("api_keys")
    @classmethod
    def _keys_not_empty(cls, v: tuple[SecretStr, ...]) -> tuple[SecretStr, ...]:
        for i, key in enumerate(v):
            if not key.get_secret_value().strip():
                raise ValueError(f"item {i}: empty API key")
        return v

    @field_validator("api_key_env")
    @classmethod
    def _env_names(cls, v: tuple[str, ...]) -> tuple[str, ...]:
        for name in v:
            if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", name):
                raise ValueError(f"'{name}' is not an environment variable name")
        return v

    @field_validator("client_header")
    @classmethod
    def _header_values(cls, v: tuple[str, ...]) -> tuple[str, ...]:
        if any(not value.strip() for value in v):
            raise ValueError("empty client header value")
        return tuple(value.strip() for value in v)

    @field_validator("user_agent")
    @classmethod
    def _regexes(cls, v: tuple[str, ...]) -> tuple[str, ...]:
        for i, pattern in enumerate(v):
            try:
                re.compile(pattern)
            except re.error as e:
                raise ValueError(f"item {i}: invalid regular expression {pattern!r}: {e}") from e
        return v


class ModelRules(Frozen):
    allow: tuple[str, ...] = ()  # shell-style patterns (fnmatch); empty: every served model
    aliases: dict[str, str] = Field(default_factory=dict)  # name the client sends -> real model

    _listify = field_validator("allow", mode="before")(_one_or_many)


class Caps(Frozen):
    max_tokens: int | None = Field(default=None, ge=1)
    n: int | None = Field(default=None, ge=1)
    action: Literal["clamp", "reject"] = "clamp"


class Policy(Frozen):
    """One client's policy (one TOML file). ``client`` defaults to the file's stem."""

    client: str = Field(pattern=NAME_PATTERN)
    priority: int = Field(default=0, ge=-1000, le=1000)  # higher is more important; < 0 sheddable
    require_api_key: bool = False
    allow_lane_override: bool = True
    default_preset: str | None = None  # used when the request names none
    presets: tuple[str, ...] = ()  # the presets the client may use; empty: all configured
    lanes: dict[str, LanePreference] = Field(default_factory=dict)  # preset -> lane
    models: ModelRules = ModelRules()
    max_concurrency: int | None = Field(default=None, ge=1)  # None: no limit
    queue_timeout: float = Field(default=30.0, ge=0, le=3600)  # seconds a request waits for a slot
    # Policies naming the same group share prompt-cache entries (None: the policy's own).
    cache_group: str | None = Field(default=None, pattern=NAME_PATTERN)
    caps: Caps = Caps()
    match: MatchRules = MatchRules()
    spec: SpecOverrides = SpecOverrides()

    @model_validator(mode="after")
    def _presets_consistent(self) -> Policy:
        if self.presets:
            if self.default_preset is not None and self.default_preset not in self.presets:
                raise ValueError(
                    f"default_preset '{self.default_preset}' is not in presets {list(self.presets)}"
                )
            for preset in self.lanes:
                if preset not in self.presets:
                    raise ValueError(f"lanes.{preset}: preset '{preset}' is not in presets")
        return self

    @property
    def name(self) -> str:
        return self.client

    @property
    def cache_partition(self) -> str:
        """Groups and clients are named apart: a policy joins another's entries only by both
        naming one group."""
        return f"group:{self.cache_group}" if self.cache_group else f"client:{self.client}"

    def allows_preset(self, preset: str) -> bool:
        return not self.presets or preset in self.presets

    def allows_model(self, model: str) -> bool:
        return not self.models.allow or any(fnmatchcase(model, p) for p in self.models.allow)

    def lane_for(self, preset: str | None, presets: Mapping[str, PresetSpec]) -> LanePreference:
        """The policy's lane for the preset, else the preset's own, else auto."""
        if preset is None:
            return "auto"
        if preset in self.lanes:
            return self.lanes[preset]
        spec = presets.get(preset)
        return spec.lane if spec is not None else "auto"


class PolicyError(Exception):
    """Invalid policies; every line of the message names the file, the key and the problem."""

    def __init__(self, problems: list[str]) -> None:
        super().__init__("\n".join(problems))
        self.problems = tuple(problems)


@dataclass(frozen=True, slots=True)
class Identity:
    policy: Policy
    via: Via
    key_presented: bool  # the request carried an API key, known or not
    malformed_key: bool = False  # the key is not valid UTF-8: it can be nobody's key


def key_digest(key: str) -> str:
    return hashlib.sha256(key.encode("utf-8")).hexdigest()


def _digest_or_none(key: str) -> str | None:
    """None for a header value that is no text (aiohttp keeps undecodable bytes as lone
    surrogates, which no configured key can contain)."""
    try:
        return key_digest(key)
    except UnicodeEncodeError:
        return None


def mask_key(key: str) -> str:
    return "key#" + key_digest(key)[:8]


def bearer_token(authorization: str | None) -> str | None:
    """The token of an ``Authorization: Bearer <token>`` header, else None."""
    if not authorization:
        return None
    scheme, _, token = authorization.strip().partition(" ")
    token = token.strip()
    return token if scheme.lower() == "bearer" and token else None


@dataclass(frozen=True)
class PolicySet:
    """The validated policies of one directory, with the lookup tables built once."""

    policies: tuple[Policy, ...]  # file-name order; the default is among them
    default: Policy
    sources: Mapping[str, str] = field(default_factory=dict)  # client -> file ("(implied)")
    key_labels: Mapping[str, tuple[str, ...]] = field(default_factory=dict)  # client -> masked
    warnings: tuple[str, ...] = ()
    _by_key: Mapping[str, str] = field(default_factory=dict, repr=False)  # digest -> client
    _by_header: Mapping[str, str] = field(default_factory=dict, repr=False)
    _by_agent: tuple[tuple[re.Pattern[str], str], ...] = field(default=(), repr=False)

    @classmethod
    def implied(cls) -> PolicySet:
        """Only the implied default: what serving without a policies directory means."""
        default = Policy(client=DEFAULT_CLIENT)
        return cls((default,), default, {DEFAULT_CLIENT: "(implied)"})

    def __iter__(self) -> Iterator[Policy]:
        return iter(self.policies)

    def __len__(self) -> int:
        return len(self.policies)

    def get(self, client: str) -> Policy | None:
        return next((p for p in self.policies if p.client == client), None)

    def admits_without_key(self, policy: Policy) -> bool:
        """The key rule: may a request without a valid key be served under ``policy``?

        Never when the default requires a key (every request needs one), nor when the
        policy itself does. Identification and the start-up exposure warning both ask this.
        """
        return not (self.default.require_api_key or policy.require_api_key)

    def keyless(self) -> tuple[Policy, ...]:
        """The policies a request without a valid key can get (empty: the router is closed)."""
        return tuple(p for p in self.policies if self.admits_without_key(p))

    def match(
        self, api_key: str | None, client_header: str | None, user_agent: str | None
    ) -> Identity:
        """Who the request is, by the precedence and key rule in the module docstring;
        never raises (``identify`` applies the verdict)."""
        presented = bool(api_key)
        if api_key:
            digest = _digest_or_none(api_key)
            if digest is None:
                return Identity(self.default, "default", True, malformed_key=True)
            if name := self._by_key.get(digest):
                return Identity(self._policy(name), "api_key", True)
        if self.default.require_api_key:
            return Identity(self.default, "default", presented)  # labels open nothing
        if client_header and (name := self._by_header.get(client_header.strip().lower())):
            policy = self._policy(name)
            if self.admits_without_key(policy):
                return Identity(policy, "client_header", presented)
        if user_agent:
            for pattern, name in self._by_agent:
                if pattern.search(user_agent) and self.admits_without_key(
                        policy := self._policy(name)):
                    return Identity(policy, "user_agent", presented)
        return Identity(self.default, "default", presented)

    def cache_partition(self, identity: Identity) -> str:
        """The request's prompt-cache partition: its policy's when a key proved who it is,
        else the default policy's (see the module docstring)."""
        policy = identity.policy if identity.via == "api_key" else self.default
        return policy.cache_partition

    def identify(
        self, api_key: str | None, client_header: str | None, user_agent: str | None
    ) -> Policy:
        """The request's policy, or ``Unauthorized`` when the key rule refuses it."""
        identity = self.match(api_key, client_header, user_agent)
        self.authorize(identity)
        return identity.policy

    def authorize(self, identity: Identity) -> None:
        if identity.malformed_key:
            raise _unauthorized(identity.policy, "the API key is not valid UTF-8",
                                "invalid_api_key")
        if identity.via == "api_key" or self.admits_without_key(identity.policy):
            return
        if identity.key_presented:
            raise _unauthorized(identity.policy, "invalid API key", "invalid_api_key")
        raise _unauthorized(identity.policy, "this router requires an API key "
                            "(Authorization: Bearer <key>)", "missing_api_key")

    def _policy(self, name: str) -> Policy:
        policy = self.get(name)
        assert policy is not None, name  # the tables are built from self.policies
        return policy


class Unauthorized(Exception):
    """The key rule refused a request; the proxy answers it with a 401 (configuration
    knows no HTTP)."""

    def __init__(self, message: str, code: str, client: str) -> None:
        super().__init__(message)
        self.message = message
        self.code = code
        self.client = client  # the policy answered under: the default, for every label


def _unauthorized(policy: Policy, message: str, code: str) -> Unauthorized:
    return Unauthorized(message, code, policy.client)


# Policy files are a few KiB; anything far bigger is a mistake (or a device), not a policy.
MAX_POLICY_FILE_BYTES = 1024 * 1024

PolicyFiles = Mapping[str, bytes | None]  # file name -> its bytes (None: a directory)


def read_policy_files(directory: Path) -> dict[str, bytes | None]:
    """Every ``*.toml`` of ``directory``, read once (the watcher compares two readings and
    parses the very bytes it compared). Raises OSError when the directory cannot be listed
    or a file cannot be read; a file removed between listing and reading is left out."""
    files: dict[str, bytes | None] = {}
    for path in sorted(directory.glob("*.toml")):
        try:
            with path.open("rb") as f:
                data = f.read(MAX_POLICY_FILE_BYTES + 1)
        except FileNotFoundError:
            continue
        except IsADirectoryError:
            data = None  # refused by the parser, which names it
        files[path.name] = data
    return files


def load_policies(
    directory: Path,
    *,
    presets: Collection[str] | None = None,
    spec: SpecSettings | None = None,
    environ: Mapping[str, str] | None = None,
) -> PolicySet:
    """Validate every ``*.toml`` in ``directory``; raise PolicyError listing every problem.

    ``presets``: the configured preset names, to check the policies against (None skips
    that check). ``spec``: the configured ``[spec]``, which each policy's ``[spec]``
    overrides must still make valid (None skips that check). ``environ``: where
    ``api_key_env`` names are read (default os.environ).
    """
    if not directory.is_dir():
        raise PolicyError([f"{directory}: not a directory"])
    try:
        files = read_policy_files(directory)
    except OSError as e:
        raise PolicyError([f"{directory}: cannot read: {e}"]) from e
    return parse_policies(directory, files, presets=presets, spec=spec, environ=environ)


def parse_policies(
    directory: Path,
    files: PolicyFiles,
    *,
    presets: Collection[str] | None = None,
    spec: SpecSettings | None = None,
    environ: Mapping[str, str] | None = None,
) -> PolicySet:
    """``load_policies`` on bytes already read (``read_policy_files``)."""
    problems: list[str] = []
    loaded: list[tuple[Policy, Path]] = []
    for name in sorted(files):
        path = directory / name
        policy = _load_file(path, files[name], presets, problems)
        if policy is not None and spec is not None:
            problems.extend(_spec_problems(path, policy, spec))
        if policy is not None:
            loaded.append((policy, path))
    builder = _Builder(environ if environ is not None else os.environ)
    for policy, path in loaded:
        builder.add(policy, path)
    problems += builder.problems
    if problems:
        raise PolicyError(problems)
    return builder.build()


def _load_file(path: Path, raw: bytes | None, presets: Collection[str] | None,
               problems: list[str]) -> Policy | None:
    if raw is None:
        problems.append(f"{path}: cannot read: is a directory")
        return None
    if len(raw) > MAX_POLICY_FILE_BYTES:
        problems.append(f"{path}: larger than {MAX_POLICY_FILE_BYTES} bytes; not a policy file")
        return None
    try:
        data = tomllib.loads(raw.decode("utf-8"))
    except UnicodeDecodeError as e:
        problems.append(f"{path}: cannot read: {e}")
        return None
    except tomllib.TOMLDecodeError as e:
        problems.append(f"{path}: invalid TOML: {e}")
        return None
    data.setdefault("client", path.stem)
    try:
        policy = Policy.model_validate(data)
    except ValidationError as e:
        problems.extend(validation_problems(str(path), e, Policy))
        return None
    if presets is not None:
        problems.extend(_unknown_presets(path, policy, presets))
    if policy.client == DEFAULT_CLIENT:
        for key in ("client_header", "user_agent"):
            if getattr(policy.match, key):
                problems.append(f"{path}: match.{key}: the default policy catches every "
                                "request that no other policy matches; remove this rule")
    return policy


def _spec_problems(path: Path, policy: Policy, spec: SpecSettings) -> list[str]:
    """A policy's [spec] overrides merged into the configured [spec] must be valid as a
    whole (``window_size = 64`` under the default ``min_sample = 128`` is not): found here,
    not on the first request of that client."""
    try:
        spec.merged(policy.spec)
    except ValidationError as e:
        return [line.replace(f"{path}: (top level): ", f"{path}: spec: ", 1)
                for line in validation_problems(str(path), e)]
    return []


def _unknown_presets(path: Path, policy: Policy, presets: Collection[str]) -> list[str]:
    known = ", ".join(sorted(presets))
    named = [("default_preset", policy.default_preset)]
    named += [(f"presets[{i}]", p) for i, p in enumerate(policy.presets)]
    named += [(f"lanes.{p}", p) for p in policy.lanes]
    return [
        f"{path}: {key}: unknown preset '{preset}' (configured presets: {known})"
        for key, preset in named
        if preset is not None and preset not in presets
    ]


class _Builder:
    """Cross-file checks (unique names, header values and keys) and the lookup tables."""

    def __init__(self, environ: Mapping[str, str]) -> None:
        self.environ = environ
        self.problems: list[str] = []
        self.warnings: list[str] = []
        self.policies: list[Policy] = []
        self.sources: dict[str, str] = {}
        self.by_key: dict[str, str] = {}
        self.by_header: dict[str, str] = {}
        self.agents: list[tuple[re.Pattern[str], str]] = []
        self.key_labels: dict[str, list[str]] = {}

    def add(self, policy: Policy, path: Path) -> None:
        name, where = policy.client, str(path)
        if name in self.sources:
            self.problems.append(f"{where}: client: '{name}' is already defined in "
                                 f"{self.sources[name]}")
            return
        self.policies.append(policy)
        self.sources[name] = where
        self.key_labels[name] = []
        for i, secret in enumerate(policy.match.api_keys):
            key = secret.get_secret_value()
            self._add_key(name, where, f"match.api_keys[{i}]", key, mask_key(key))
        for i, env in enumerate(policy.match.api_key_env):
            key = self.environ.get(env, "").strip()
            if not key:
                self.warnings.append(f"{where}: match.api_key_env[{i}]: ${env} is not set; "
                                     "this key is ignored")
                self.key_labels[name].append(f"${env} (unset)")
                continue
            self._add_key(name, where, f"match.api_key_env[{i}]", key, f"${env}")
        for i, value in enumerate(policy.match.client_header):
            owner = self.by_header.setdefault(value.lower(), name)
            if owner != name:
                self.problems.append(f"{where}: match.client_header[{i}]: '{value}' is already "
                                     f"used by client '{owner}' ({self.sources[owner]})")
        self.agents += [(re.compile(p), name) for p in policy.match.user_agent]
        self._warn_unprotected(policy, where)

    def _add_key(self, name: str, where: str, key_path: str, key: str, label: str) -> None:
        owner = self.by_key.setdefault(key_digest(key), name)
        if owner != name:
            self.problems.append(f"{where}: {key_path}: this API key is already used by client "
                                 f"'{owner}' ({self.sources[owner]})")
            return
        self.key_labels[name].append(label)

    def _warn_unprotected(self, policy: Policy, where: str) -> None:
        has_keys = any(not label.endswith("(unset)") for label in self.key_labels[policy.client])
        recognisable = policy.match.client_header or policy.match.user_agent
        if has_keys and recognisable and not policy.require_api_key:
            self.warnings.append(f"{where}: require_api_key: false, so a client header or user "
                                 "agent selects this policy without its key")
        if policy.require_api_key and not has_keys:
            self.warnings.append(f"{where}: require_api_key: true but no usable key; every "
                                 "request identified as this client gets 401")

    def build(self) -> PolicySet:
        default = next((p for p in self.policies if p.client == DEFAULT_CLIENT), None)
        if default is None:
            default = Policy(client=DEFAULT_CLIENT)
            self.policies.append(default)
            self.sources[DEFAULT_CLIENT] = "(implied)"
            self.key_labels[DEFAULT_CLIENT] = []
        return PolicySet(
            policies=tuple(self.policies),
            default=default,
            sources=dict(self.sources),
            key_labels={k: tuple(v) for k, v in self.key_labels.items()},
            warnings=tuple(self.warnings),
            _by_key=dict(self.by_key),
            _by_header=dict(self.by_header),
            _by_agent=tuple(self.agents),
        )
