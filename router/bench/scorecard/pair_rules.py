"""``speclane bench`` results as gating rules: measured acceptance per pair ->
``[[gating.pairs]]``. A pair that failed its floor stays ``allow`` with ``passed_floor =
false``: strict mode denies it (``deny_below_floor``), graceful mode runs it and lets the
auto-disable judge."""

from __future__ import annotations

import json
import re
import time
from collections.abc import Iterable, Mapping
from typing import Any

from router.config.gating import SETTINGS_KEY, PairRule
from router.lanes.gating.decide import model_key

_BARE_KEY = re.compile(r"^[A-Za-z0-9_-]+$")


class BenchFormatError(ValueError):
    """The bench JSON has no usable ``pairs`` section."""


def pair_rule_from_bench(entry: Mapping[str, Any], *, when: str | None = None) -> PairRule:
    """One bench ``pairs`` entry as an allow rule with its measured acceptance."""
    try:
        target, draft = str(entry["target"]), str(entry["draft"])
    except KeyError as e:
        raise BenchFormatError(f"a bench pair has no {e.args[0]!r}") from None
    families = {
        str(k): round(float(v), 3)
        for k, v in (entry.get("acceptance_by_family") or {}).items()
        if v is not None
    }
    overall = entry.get("acceptance")
    if overall is None and families:
        overall = sum(families.values()) / len(families)  # each family counts the same
    passed = entry.get("passed_floor")
    floor = entry.get("floor")
    stamp = when or time.strftime("%Y-%m-%d", time.gmtime())
    note = f"speclane bench {stamp}" + (f", floor {float(floor):g}" if floor is not None else "")
    return PairRule(
        target=model_key(target),
        draft=model_key(draft),
        action="allow",
        measured_acceptance=None if overall is None else round(float(overall), 3),
        acceptance_by_family=families,
        passed_floor=None if passed is None else bool(passed),
        note=note,
    )


def pair_rules_from_bench(
    bench: Mapping[str, Any] | str, *, when: str | None = None
) -> tuple[PairRule, ...]:
    """Every pair of a bench result (the parsed JSON, or its text)."""
    data = json.loads(bench) if isinstance(bench, str) else bench
    pairs = data.get("pairs") if isinstance(data, Mapping) else None
    if isinstance(pairs, Mapping):  # a single pair written as an object
        pairs = [pairs]
    if not isinstance(pairs, list) or not pairs:
        raise BenchFormatError("the bench result has no 'pairs' section")
    return tuple(pair_rule_from_bench(p, when=when) for p in pairs)


def merged_rules(existing: Iterable[PairRule], new: Iterable[PairRule]) -> tuple[PairRule, ...]:
    """``existing`` with each new rule replacing the rule for the same (target, draft)."""
    fresh = {(r.target, r.draft): r for r in new}
    kept = [r for r in existing if (r.target, r.draft) not in fresh]
    return (*kept, *fresh.values())


def rules_to_toml(rules: Iterable[PairRule]) -> str:
    """The ``[[gating.pairs]]`` tables for these rules, ready to paste into speclane.toml."""
    blocks = []
    for rule in rules:
        lines = [
            f"[[{SETTINGS_KEY}.pairs]]",
            f"target = {_string(rule.target)}",
            f"draft = {_string(rule.draft)}",
            f"action = {_string(rule.action)}",
        ]
        if rule.measured_acceptance is not None:
            lines.append(f"measured_acceptance = {_number(rule.measured_acceptance)}")
        if rule.acceptance_by_family:
            inner = ", ".join(
                f"{_key(k)} = {_number(v)}" for k, v in sorted(rule.acceptance_by_family.items())
            )
            lines.append(f"acceptance_by_family = {{ {inner} }}")
        if rule.passed_floor is not None:
            lines.append(f"passed_floor = {'true' if rule.passed_floor else 'false'}")
        if rule.note:
            lines.append(f"note = {_string(rule.note)}")
        blocks.append("\n".join(lines))
    return "\n\n".join(blocks) + ("\n" if blocks else "")


def _string(text: str) -> str:
    # A JSON string is a valid TOML basic string for everything json.dumps emits (ASCII
    # escapes \" \\ \n \t \uXXXX).
    return json.dumps(text)


def _key(text: str) -> str:
    return text if _BARE_KEY.match(text) else _string(text)


def _number(value: float) -> str:
    text = f"{value:.3f}".rstrip("0")
    return text + "0" if text.endswith(".") else text
