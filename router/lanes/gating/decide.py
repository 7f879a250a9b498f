"""Capability gating of speculation: is this draft/target pair fit to speculate, and what then.

- ``check_pair(target, draft)`` (``router.lanes.gating.inspect``) reads both model directories
  into a ``PairReport`` (``router.lanes.gating.findings``).
- ``GatingSettings`` (``[gating]`` in speclane.toml, ``router.config.gating``): strict or
  graceful, per lane and per preset, plus an allow/deny list of model pairs with their measured
  acceptance (written by ``speclane bench``: ``router.bench.scorecard.pair_rules``).
- ``decide(report, settings, target, draft)`` (pure): the ``GateDecision``. Strict: a problem or
  a denied pair stops start-up (``fatal``). Graceful (the default): the lane starts without its
  draft, and ``reason`` says why for /admin/lanes, the metrics and one warning log line.
"""

from __future__ import annotations

import fnmatch
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from router.config.gating import SETTINGS_KEY, GateMode, GatingSettings, PairRule
from router.lanes.gating.findings import DecisionCode, PairReport, ProblemCode
from router.lanes.gating.inspect import check_pair

__all__ = ["GateDecision", "check_pair", "decide", "lane_mode", "preset_mode"]


def lane_mode(settings: GatingSettings, lane: str, presets: Iterable[str] = ()) -> GateMode:
    """The mode gating a lane: its own (or the global) mode, made strict by any strict preset
    routed to it, since that preset's requests were promised speculation."""
    if settings.lane_modes.get(lane, settings.mode) == "strict":
        return "strict"
    return "strict" if any(preset_mode(settings, p) == "strict" for p in presets) else "graceful"


def preset_mode(settings: GatingSettings, preset: str | None) -> GateMode:
    """A preset's mode (its own, else the global one). Used at lane start, through
    ``lane_mode``: requests are not refused one by one when speculation is off for them."""
    if preset is None:
        return settings.mode
    return settings.preset_modes.get(preset, settings.mode)


# --- the decision ----------------------------------------------------------------------------


@dataclass(frozen=True)
class GateDecision:
    active: bool  # start the lane with its draft
    mode: GateMode
    reason: str | None  # one line, set whenever active is False
    fatal: bool  # strict and blocked: start-up must stop, showing ``message``
    code: ProblemCode | DecisionCode | None = None  # the first blocking code
    warnings: tuple[str, ...] = ()  # lines to log; they never block
    rule: PairRule | None = None  # the pair rule that matched, if any
    details: tuple[str, ...] = field(default=(), repr=False)  # every blocking finding

    @property
    def message(self) -> str:
        """The actionable text for a fatal decision (or a log): what is wrong, what to change."""
        if self.active:
            return "speculation enabled" + (
                f" ({'; '.join(self.warnings)})" if self.warnings else ""
            )
        head = f"speculation cannot start with this model pair (gating mode: {self.mode}):"
        lines = [head, *(f"  - {d}" for d in self.details)]
        if self.fatal:
            lines.append(
                f"  To start the lane without speculation instead, set {SETTINGS_KEY}.mode"
                f' = "graceful" (or {SETTINGS_KEY}.lane_modes / preset_modes), or turn'
                " the lane off with lanes.speculative.enabled = false."
            )
        return "\n".join(lines)


def model_key(name: str | Path) -> str:
    """A model's short name for messages: a path's last component, a repo id as is."""
    text = str(name).rstrip("/")
    if text.startswith(("/", "~", ".")):
        return Path(text).name or text
    return text


def rule_matches(rule: PairRule, target: str | Path, draft: str | Path | None) -> bool:
    if draft is None:
        return False
    return _name_matches(rule.target, target) and _name_matches(rule.draft, draft)


def _name_matches(pattern: str, name: str | Path) -> bool:
    # The full name, and its last component: a rule "Qwen2.5-7B" names the directory
    # /models/Qwen2.5-7B and the repo mlx-community/Qwen2.5-7B alike.
    text = str(name).rstrip("/")
    return any(
        fnmatch.fnmatchcase(candidate, pattern) for candidate in (text, text.rsplit("/", 1)[-1])
    )


def matching_rule(
    settings: GatingSettings, target: str | Path, draft: str | Path | None
) -> PairRule | None:
    """The rule for a pair: the first matching deny, else the first matching allow."""
    matches = [r for r in settings.pairs if rule_matches(r, target, draft)]
    denied = [r for r in matches if r.action == "deny"]
    first = denied or matches
    return first[0] if first else None


def below_floor(rule: PairRule, floor: float) -> bool:
    if rule.passed_floor is False:
        return True
    return rule.measured_acceptance is not None and rule.measured_acceptance < floor


def decide(
    report: PairReport,
    settings: GatingSettings,
    target_name: str | Path,
    draft_name: str | Path | None,
    *,
    lane: str = "speculative",
    presets: Iterable[str] = (),
) -> GateDecision:
    """Strict vs graceful, and the allow/deny list. A deny beats an allow; an allow silences
    the "draft not smaller" warning but never overrides a problem of the report."""
    mode = lane_mode(settings, lane, presets)
    rule = matching_rule(settings, target_name, draft_name)
    blocking: list[tuple[Any, str]] = [(p.code, p.line()) for p in report.problems]
    warnings = [
        w.line()
        for w in report.warnings
        if not (rule is not None and rule.action == "allow" and w.code == "draft_not_smaller")
    ]
    pairs_key = f"{SETTINGS_KEY}.pairs"
    if rule is not None and rule.action == "deny":
        note = f": {rule.note}" if rule.note else ""
        blocking.insert(
            0,
            (
                "denied",
                f"denied: the pair {model_key(target_name)} + "
                f"{model_key(draft_name or '')} is denied by "
                f"{pairs_key}{note} (change {pairs_key})",
            ),
        )
    elif rule is not None and below_floor(rule, settings.acceptance_floor):
        line = (
            f"below_floor: measured acceptance {_acceptance(rule)} is below the floor "
            f"{settings.acceptance_floor:g} (change {SETTINGS_KEY}.acceptance_floor, "
            f"{SETTINGS_KEY}.deny_below_floor or {pairs_key})"
        )
        if mode == "strict" and settings.deny_below_floor:
            blocking.append(("below_floor", line))
        else:
            warnings.append(line)
    elif rule is None and settings.require_listed and draft_name is not None:
        blocking.append(
            (
                "not_validated",
                f"not_validated: no allow rule in {pairs_key} names "
                f"this pair and {SETTINGS_KEY}.require_listed is true (run speclane "
                f"bench and add its rule to {pairs_key})",
            )
        )
    if not blocking:
        return GateDecision(True, mode, None, False, warnings=tuple(warnings), rule=rule)
    codes, lines = zip(*blocking, strict=True)
    return GateDecision(
        active=False,
        mode=mode,
        reason="; ".join(lines),
        fatal=mode == "strict",
        code=codes[0],
        warnings=tuple(warnings),
        rule=rule,
        details=tuple(lines),
    )


def _acceptance(rule: PairRule) -> str:
    if rule.measured_acceptance is None:
        return "(bench: failed its floor)"
    return f"{rule.measured_acceptance:.2f}"
