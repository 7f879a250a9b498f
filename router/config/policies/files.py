"""Loading ``policies/*.toml`` (one file per client) into a ``PolicySet``: reading the
files once, parsing, validating against the presets and speculation settings, and every
problem named by file, key and reason."""

from __future__ import annotations

import os
import re
import tomllib
from collections.abc import Collection, Mapping
from pathlib import Path

from pydantic import (
    ValidationError,
)

from router.config.base import validation_problems
from router.config.policies.identity import PolicySet, key_digest, mask_key
from router.config.policies.schema import DEFAULT_CLIENT, Policy, PolicyError
from router.config.speculation import SpecSettings

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


def _load_file(
    path: Path, raw: bytes | None, presets: Collection[str] | None, problems: list[str]
) -> Policy | None:
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
                problems.append(
                    f"{path}: match.{key}: the default policy catches every "
                    "request that no other policy matches; remove this rule"
                )
    return policy


def _spec_problems(path: Path, policy: Policy, spec: SpecSettings) -> list[str]:
    """A policy's [spec] overrides merged into the configured [spec] must be valid as a
    whole (``window_size = 64`` under the default ``min_sample = 128`` is not): found here,
    not on the first request of that client."""
    try:
        spec.merged(policy.spec)
    except ValidationError as e:
        return [
            line.replace(f"{path}: (top level): ", f"{path}: spec: ", 1)
            for line in validation_problems(str(path), e)
        ]
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
        self.notes: list[str] = []
        self.policies: list[Policy] = []
        self.sources: dict[str, str] = {}
        self.by_key: dict[str, str] = {}
        self.by_header: dict[str, str] = {}
        self.agents: list[tuple[re.Pattern[str], str]] = []
        self.key_labels: dict[str, list[str]] = {}

    def add(self, policy: Policy, path: Path) -> None:
        name, where = policy.client, str(path)
        if name in self.sources:
            self.problems.append(
                f"{where}: client: '{name}' is already defined in {self.sources[name]}"
            )
            return
        self.policies.append(policy)
        self.sources[name] = where
        self.key_labels[name] = []
        for i, secret in enumerate(policy.match.api_keys):
            key = secret.get_secret_value()
            self._add_key(name, where, f"match.api_keys[{i}]", key, mask_key(key))
        unset: list[str] = []
        for i, env in enumerate(policy.match.api_key_env):
            key = self.environ.get(env, "").strip()
            if not key:
                unset.append(f"${env}")
                self.key_labels[name].append(f"${env} (unset)")
                continue
            self._add_key(name, where, f"match.api_key_env[{i}]", key, f"${env}")
        for i, value in enumerate(policy.match.client_header):
            owner = self.by_header.setdefault(value.lower(), name)
            if owner != name:
                self.problems.append(
                    f"{where}: match.client_header[{i}]: '{value}' is already "
                    f"used by client '{owner}' ({self.sources[owner]})"
                )
        self.agents += [(re.compile(p), name) for p in policy.match.user_agent]
        self._warn_unprotected(policy, where, unset)

    def _add_key(self, name: str, where: str, key_path: str, key: str, label: str) -> None:
        owner = self.by_key.setdefault(key_digest(key), name)
        if owner != name:
            self.problems.append(
                f"{where}: {key_path}: this API key is already used by client "
                f"'{owner}' ({self.sources[owner]})"
            )
            return
        self.key_labels[name].append(label)

    def _warn_unprotected(self, policy: Policy, where: str, unset: list[str]) -> None:
        """A key variable unset is a note (one per policy), not a warning: the files are
        right and this machine has not set the variable yet, as with the shipped batch.toml
        and SPECLANE_BATCH_API_KEY. A policy that requires a key and names none is a mistake."""
        has_keys = any(not label.endswith("(unset)") for label in self.key_labels[policy.client])
        recognisable = policy.match.client_header or policy.match.user_agent
        if has_keys and recognisable and not policy.require_api_key:
            self.warnings.append(
                f"{where}: require_api_key: false, so a client header or user "
                "agent selects this policy without its key"
            )
        variables = ", ".join(unset)
        if policy.require_api_key and not has_keys and unset:
            self.notes.append(
                f"{where}: inactive until {variables} is set (match.api_key_env): "
                "require_api_key is true and no other key is given, so a request "
                "identified as this client gets 401"
            )
        elif policy.require_api_key and not has_keys:
            self.warnings.append(
                f"{where}: require_api_key: true but no usable key; every "
                "request identified as this client gets 401"
            )
        elif unset:
            self.notes.append(f"{where}: match.api_key_env: {variables} not set; ignored")

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
            notes=tuple(self.notes),
            _by_key=dict(self.by_key),
            _by_header=dict(self.by_header),
            _by_agent=tuple(self.agents),
        )
