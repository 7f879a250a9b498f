"""``speclane policy check [DIR]``: validate every policy file and print the resolved table.
``speclane policy reload``: make a running router reload its policies now
(``router.cli.reload``).

Exit status: 0 valid (warnings go to stderr), 1 invalid (every problem names the file,
the key and what is wrong), 2 usage error.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path

from router.cli.reload import run_reload
from router.cli.status import ADMIN_KEY_ENV, DEFAULT_URL
from router.config.names import CLIENT_HEADER
from router.config.policies import (
    DEFAULT_CLIENT,
    Policy,
    PolicyError,
    PolicySet,
    load_policies,
)
from router.config.presets import DEFAULT_PRESETS, PresetSpec
from router.config.settings import ConfigError, load_settings

COLUMNS = ("client", "recognised by", "preset -> lane", "access", "limits")


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="speclane policy", description=__doc__.splitlines()[0].replace("``", "'")
    )
    sub = parser.add_subparsers(dest="command", required=True)
    check = sub.add_parser("check", help="validate policies and print the resolved table")
    check.add_argument(
        "directory",
        nargs="?",
        type=Path,
        help="the policies directory (default: the one serve would use: "
        "policies_dir of --config, else ./policies, else policies/ next to "
        "--config, else the ones shipped with speclane)",
    )
    check.add_argument(
        "--config", type=Path, help="speclane.toml, for its presets and policies_dir"
    )
    reload = sub.add_parser(
        "reload",
        help="make a running router reload its policies now, "
        "including a change it held because it widens access",
    )
    reload.add_argument(
        "--url", default=DEFAULT_URL, help=f"router root URL (default {DEFAULT_URL})"
    )
    reload.add_argument(
        "--admin-key",
        default=None,
        help=f"admin key (default: ${ADMIN_KEY_ENV}, else the router's local "
        "admin token when --url is on this machine)",
    )
    reload.add_argument(
        "--timeout",
        type=float,
        default=30.0,
        help="seconds (default 30: the router waits for files being written)",
    )
    try:
        args = parser.parse_args(list(sys.argv[1:] if argv is None else argv))
    except SystemExit as e:
        return int(e.code or 0)
    if args.command == "reload":
        return run_reload(args.url, args.admin_key, args.timeout)
    return run_check(args.directory, args.config)


def run_check(directory: Path | None, config: Path | None) -> int:
    presets: Mapping[str, PresetSpec] = DEFAULT_PRESETS
    try:
        # The directory serve would use: policies_dir of --config (relative to that file),
        # else ./policies, else policies/ next to --config, else the shipped defaults.
        settings = load_settings(config)
    except ConfigError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    presets = settings.presets
    directory = directory or settings.policies_dir
    try:
        policies = load_policies(directory, presets=presets.keys(), spec=settings.spec)
    except PolicyError as e:
        print(f"{directory}: invalid policies:", file=sys.stderr)
        for problem in e.problems:
            print(f"  {problem}", file=sys.stderr)
        return 1
    for note in policies.notes:
        print(f"note: {note}", file=sys.stderr)
    for warning in policies.warnings:
        print(f"warning: {warning}", file=sys.stderr)
    print(render_table(policies, presets, directory))
    return 0


def render_table(policies: PolicySet, presets: Mapping[str, PresetSpec], where: Path) -> str:
    header = [
        f"{where}: {len(policies)} client(s), all valid.",
        f"A request is recognised by its API key, else {CLIENT_HEADER}, else its User-Agent "
        f"(first file that matches), else '{DEFAULT_CLIENT}'. Priority: higher is more "
        "important, below 0 sheddable.",
        "",
    ]
    rows = [_row(p, policies, presets) for p in _ordered(policies)]
    return "\n".join(header + _format([[[c] for c in COLUMNS], *rows]))


def _ordered(policies: PolicySet) -> list[Policy]:
    # The default last: it is what is left when nothing else matched.
    return sorted(policies, key=lambda p: (p.client == DEFAULT_CLIENT, p.client))


def _row(policy: Policy, policies: PolicySet, presets: Mapping[str, PresetSpec]) -> list[list[str]]:
    source = policies.sources.get(policy.client, "")
    client = [policy.client, f"({Path(source).name if source != '(implied)' else source})"]
    return [
        client,
        _match(policy, policies),
        _lanes(policy, presets),
        _access(policy) + _cache(policy, policies),
        _limits(policy),
    ]


def _match(policy: Policy, policies: PolicySet) -> list[str]:
    lines = [f"api key: {label}" for label in policies.key_labels.get(policy.client, ())]
    lines += [f"header: {value}" for value in policy.match.client_header]
    lines += [f"user-agent: /{pattern}/" for pattern in policy.match.user_agent]
    if policy.client == DEFAULT_CLIENT:
        lines.append("every other request")
    return lines or ["(nothing: unreachable)"]


def _lanes(policy: Policy, presets: Mapping[str, PresetSpec]) -> list[str]:
    names = policy.presets or tuple(sorted(presets))
    lines = []
    for name in names:
        source = "policy" if name in policy.lanes else "preset"
        mark = " *" if name == policy.default_preset else ""
        lines.append(f"{name}{mark} -> {policy.lane_for(name, presets)} ({source})")
    if policy.default_preset is None:
        lines.append("(no preset) -> auto")
    else:
        lines.append("* default preset")
    return lines


def _access(policy: Policy) -> list[str]:
    models = ", ".join(policy.models.allow) or "all served"
    lines = [f"models: {models}"]
    if policy.models.load is not None:  # unset: may load every model it may use
        lines.append(f"may load: {', '.join(policy.models.load) or 'none'}")
    lines += [f"alias {alias} -> {target}" for alias, target in policy.models.aliases.items()]
    lines.append(f"presets: {', '.join(policy.presets) or 'all'}")
    lines.append("lane override: " + ("allowed" if policy.allow_lane_override else "403"))
    lines.append("api key: " + ("required" if policy.require_api_key else "optional"))
    return lines


def _cache(policy: Policy, policies: PolicySet) -> list[str]:
    """Whose cached prompts the client's requests can reuse (``PolicySet.cache_partition``):
    only a request proved by a key has its policy's partition."""
    if policy.cache_partition == policies.default.cache_partition:
        return ["prompt cache: default"]
    labels = policies.key_labels.get(policy.client, ())
    if all(label.endswith("(unset)") for label in labels):
        return ["prompt cache: default (no key)"]
    lines = [f"prompt cache: {f'group {policy.cache_group}' if policy.cache_group else 'own'}"]
    if not policy.require_api_key:
        lines.append("  (default without the key)")
    return lines


def _limits(policy: Policy) -> list[str]:
    concurrency = policy.max_concurrency or "unlimited"
    lines = [
        f"priority {policy.priority}",
        f"concurrency {concurrency}",
        f"queue timeout {policy.queue_timeout:g} s",
    ]
    caps = policy.caps
    for key in ("max_tokens", "n"):
        value = getattr(caps, key)
        if value is not None:
            lines.append(f"{key} <= {value} ({caps.action})")
    return lines


def _format(rows: list[list[list[str]]]) -> list[str]:
    widths = [
        max(len(line) for row in rows for line in row[i] or [""]) for i in range(len(COLUMNS))
    ]
    out: list[str] = []
    for index, row in enumerate(rows):
        height = max(len(cell) for cell in row)
        for k in range(height):
            parts = [
                (cell[k] if k < len(cell) else "").ljust(width)
                for cell, width in zip(row, widths, strict=True)
            ]
            out.append("  ".join(parts).rstrip())
        if index == 0:
            out.append("  ".join("-" * w for w in widths))
        elif index < len(rows) - 1:
            out.append("")
    return out
