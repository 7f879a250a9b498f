"""A scorecard's measured pair as a ``[[gating.pairs]]`` rule, to paste into speclane.toml. A
pair that failed its floor stays ``allow`` with ``passed_floor = false``: strict mode denies
it (``deny_below_floor``), graceful mode runs it and lets the auto-disable judge."""

from __future__ import annotations

import json
import re
import time
from collections.abc import Iterable, Mapping
from typing import Any

from router.config.gating import SETTINGS_KEY, PairRule
from router.lanes.gating.decide import model_key

_BARE_KEY = re.compile(r"^[A-Za-z0-9_-]+$")


def pair_rule_from_bench(entry: Mapping[str, Any], *, when: str | None = None) -> PairRule:
    """One scorecard ``pairs`` entry as an allow rule with its measured acceptance."""
    families = {
        str(k): round(float(v), 3)
        for k, v in (entry.get("acceptance_by_family") or {}).items()
        if v is not None
    }
    overall, passed, floor = (entry.get(k) for k in ("acceptance", "passed_floor", "floor"))
    when = when or time.strftime("%Y-%m-%d", time.gmtime())
    if overall is None and families:
        overall = sum(families.values()) / len(families)  # each family counts the same
    return PairRule(
        target=model_key(str(entry["target"])),
        draft=model_key(str(entry["draft"])),
        action="allow",
        measured_acceptance=None if overall is None else round(float(overall), 3),
        acceptance_by_family=families,
        passed_floor=None if passed is None else bool(passed),
        note=f"speclane bench {when}" + (f", floor {float(floor):g}" if floor is not None else ""),
    )


def rules_to_toml(rules: Iterable[PairRule]) -> str:
    blocks = []
    for rule in rules:
        lines = [f"[[{SETTINGS_KEY}.pairs]]"]
        lines += [
            f"{k} = {_string(v)}"
            for k, v in (("target", rule.target), ("draft", rule.draft), ("action", rule.action))
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
