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
    """The rules as TOML tables; a field that is not set is left out."""
    # A JSON string is a valid TOML basic string for everything json.dumps emits.
    blocks = []
    for rule in rules:
        families = sorted(rule.acceptance_by_family.items())
        inner = ", ".join(
            f"{k if _BARE_KEY.match(k) else json.dumps(k)} = {_number(v)}" for k, v in families
        )
        values = {
            "target": json.dumps(rule.target),
            "draft": json.dumps(rule.draft),
            "action": json.dumps(rule.action),
            "measured_acceptance": _number(rule.measured_acceptance),
            "acceptance_by_family": f"{{ {inner} }}" if families else None,
            "passed_floor": None if rule.passed_floor is None else str(rule.passed_floor).lower(),
            "note": json.dumps(rule.note) if rule.note else None,
        }
        lines = [f"{key} = {value}" for key, value in values.items() if value is not None]
        blocks.append("\n".join([f"[[{SETTINGS_KEY}.pairs]]", *lines]))
    return "\n\n".join(blocks) + ("\n" if blocks else "")


def _number(value: float | None) -> str | None:
    text = None if value is None else f"{value:.3f}".rstrip("0")
    return text + "0" if text and text.endswith(".") else text
