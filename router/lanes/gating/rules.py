"""Capability gating of speculation: is this draft/target pair fit to speculate, and what then.

Three parts, all pure except ``check_pair`` (which reads the model directories, see
``router.lanes.gating.inspect``):

- ``PairReport``: what ``check_pair(target, draft)`` found, as problems (hard
  incompatibilities: speculation would crash, or propose tokens the target reads as something
  else) and warnings (it works, but may not pay). Each finding names the setting to change.
- ``GatingSettings`` (``[gating]`` in speclane.toml): strict or graceful, per lane and per
  preset, plus an allow/deny list of model pairs with their measured acceptance.
- ``decide(report, settings, target, draft)``: the ``GateDecision``. Strict: a problem or a
  denied pair stops start-up (``fatal``). Graceful (the default): the lane starts without its
  draft, and ``reason`` says why for /admin/lanes, the metrics and one warning log line.

``speclane bench`` records measured acceptance as rules: its JSON carries a ``pairs`` section,
a list of ``{"target", "draft", "acceptance_by_family": {family: ratio}, "passed_floor": bool}``
(optionally ``"acceptance"``, the overall ratio, and ``"floor"``); ``pair_rule_from_bench``
turns an entry into an ``allow`` rule with its measured acceptance (a pair that failed its
floor stays ``allow`` with ``passed_floor = false``: strict mode denies it when
``deny_below_floor`` is on, graceful runs it and lets auto-disable judge), and
``rules_to_toml`` renders rules as ``[[gating.pairs]]`` tables to paste into speclane.toml.
"""

from __future__ import annotations

import fnmatch
import json
import re
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field

SETTINGS_KEY = "gating"  # the speclane.toml table; messages name settings under it

GateMode = Literal["strict", "graceful"]
_BARE_KEY = re.compile(r"^[A-Za-z0-9_-]+$")

# Findings of check_pair. Problems block speculation; warnings never do.
ProblemCode = Literal[
    "no_draft",  # speculation requested, no draft model configured
    "model_not_found",  # not a directory, not in the Hugging Face cache
    "config_invalid",  # config.json missing, unreadable, or mlx-lm cannot build the model
    "weights_missing",  # no model*.safetensors
    "weights_invalid",  # a safetensors header that does not parse, or a truncated file
    "tokenizer_unloadable",
    "architecture_unsupported",  # mlx-lm has no such model type
    "custom_code",  # config.json names a model_file: mlx-lm runs it only with trust_remote_code
    "multimodal",  # vision/audio models: the lanes serve text only
    "cache_not_trimmable",  # recurrent/SSM caches cannot rewind rejected draft tokens
    "vocab_size_mismatch",
    "vocab_mismatch",  # same size, different token -> id mapping
    "special_token_mismatch",  # bos/eos or a chat-template token has another id
    "chat_template_mismatch",  # the two templates render a conversation to other token ids
]
WarningCode = Literal[
    "draft_not_smaller",  # the draft's weights are not smaller: it cannot pay
    "embedding_size_differs",  # same tokenizer, padded embeddings of other sizes
    "pad_token_differs",  # never enters generation
    "chat_template_missing",
    "chat_template_unrenderable",
    "sliding_window_cache",  # rewinds only while the context fits the window
]
# Why a decision keeps speculation off, beyond the report's problem codes. below_floor: the pair's
# measured acceptance is under the floor (blocks in strict mode only; a warning otherwise).
DecisionCode = Literal["denied", "below_floor", "not_validated"]

TARGET_SETTING = "lanes.model"
DRAFT_SETTING = "lanes.draft_model"


@dataclass(frozen=True)
class Finding:
    code: ProblemCode | WarningCode
    message: str
    setting: str  # the configuration key to change, e.g. lanes.draft_model

    def line(self) -> str:
        return f"{self.code}: {self.message} (change {self.setting})"


@dataclass(frozen=True)
class ModelFacts:
    """What the checks read about one model directory (for messages and status)."""

    path: str
    model_type: str | None = None
    weight_bytes: int | None = None  # sum of tensor sizes from the safetensors headers
    tokenizer_size: int | None = None  # len(tokenizer), added tokens included
    config_vocab_size: int | None = None  # embedding rows, often padded past the tokenizer


@dataclass(frozen=True)
class PairReport:
    target: str
    draft: str | None
    problems: tuple[Finding, ...] = ()
    warnings: tuple[Finding, ...] = ()
    target_facts: ModelFacts | None = None
    draft_facts: ModelFacts | None = None

    @property
    def ok(self) -> bool:
        return not self.problems

    def summary(self) -> str:
        """One line: the problems, or "ok" (with the warnings' codes)."""
        if self.problems:
            return "; ".join(p.line() for p in self.problems)
        if self.warnings:
            return "ok, warnings: " + ", ".join(w.code for w in self.warnings)
        return "ok"

    def to_dict(self) -> dict[str, Any]:
        def findings(items: tuple[Finding, ...]) -> list[dict[str, str]]:
            return [{"code": f.code, "message": f.message, "setting": f.setting} for f in items]

        return {"target": self.target, "draft": self.draft, "ok": self.ok,
                "problems": findings(self.problems), "warnings": findings(self.warnings)}


def check_pair(target: str | Path, draft: str | Path | None) -> PairReport:
    """Read both model directories (configs, safetensors headers, tokenizers; no weights)."""
    from router.lanes.gating.inspect import check_pair as run_checks

    return run_checks(target, draft)


# --- configuration ---------------------------------------------------------------------------

Fraction = Annotated[float, Field(ge=0.0, le=1.0)]


class PairRule(BaseModel):
    """One ``[[gating.pairs]]`` entry. ``target`` / ``draft`` are model names (a model
    directory's name, a repo id, or a full path) or shell patterns (``Qwen2.5-*``)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    target: str = Field(min_length=1)
    draft: str = Field(min_length=1)
    action: Literal["allow", "deny"] = "allow"
    measured_acceptance: Fraction | None = None  # written by speclane bench
    acceptance_by_family: dict[str, Fraction] = Field(default_factory=dict)
    passed_floor: bool | None = None  # the bench's verdict against its own floor
    note: str = ""


class GatingSettings(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    mode: GateMode = "graceful"
    # Per lane or external backend name ("speculative", "lmstudio", ...), and per preset.
    lane_modes: dict[str, GateMode] = Field(default_factory=dict)
    preset_modes: dict[str, GateMode] = Field(default_factory=dict)
    pairs: tuple[PairRule, ...] = ()
    acceptance_floor: Fraction = 0.3
    deny_below_floor: bool = True  # strict mode only: a pair measured below the floor is denied
    # Speculate only with pairs an allow rule names (validated by speclane bench).
    require_listed: bool = False


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
            return "speculation enabled" + (f" ({'; '.join(self.warnings)})" if self.warnings
                                             else "")
        head = f"speculation cannot start with this model pair (gating mode: {self.mode}):"
        lines = [head, *(f"  - {d}" for d in self.details)]
        if self.fatal:
            lines.append(f'  To start the lane without speculation instead, set {SETTINGS_KEY}.mode'
                         f' = "graceful" (or {SETTINGS_KEY}.lane_modes / preset_modes), or turn'
                         " the lane off with lanes.speculative.enabled = false.")
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
    return any(fnmatch.fnmatchcase(candidate, pattern)
               for candidate in (text, text.rsplit("/", 1)[-1]))


def matching_rule(settings: GatingSettings, target: str | Path,
                  draft: str | Path | None) -> PairRule | None:
    """The rule for a pair: the first matching deny, else the first matching allow."""
    matches = [r for r in settings.pairs if rule_matches(r, target, draft)]
    denied = [r for r in matches if r.action == "deny"]
    return (denied or matches or [None])[0]


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
    warnings = [w.line() for w in report.warnings
                if not (rule is not None and rule.action == "allow"
                        and w.code == "draft_not_smaller")]
    pairs_key = f"{SETTINGS_KEY}.pairs"
    if rule is not None and rule.action == "deny":
        note = f": {rule.note}" if rule.note else ""
        blocking.insert(0, ("denied", f"denied: the pair {model_key(target_name)} + "
                                      f"{model_key(draft_name or '')} is denied by "
                                      f"{pairs_key}{note} (change {pairs_key})"))
    elif rule is not None and below_floor(rule, settings.acceptance_floor):
        line = (f"below_floor: measured acceptance {_acceptance(rule)} is below the floor "
                f"{settings.acceptance_floor:g} (change {SETTINGS_KEY}.acceptance_floor, "
                f"{SETTINGS_KEY}.deny_below_floor or {pairs_key})")
        if mode == "strict" and settings.deny_below_floor:
            blocking.append(("below_floor", line))
        else:
            warnings.append(line)
    elif rule is None and settings.require_listed and draft_name is not None:
        blocking.append(("not_validated", f"not_validated: no allow rule in {pairs_key} names "
                         f"this pair and {SETTINGS_KEY}.require_listed is true (run speclane "
                         f"bench and add its rule to {pairs_key})"))
    if not blocking:
        return GateDecision(True, mode, None, False, warnings=tuple(warnings), rule=rule)
    codes, lines = zip(*blocking, strict=True)
    return GateDecision(
        active=False, mode=mode, reason="; ".join(lines), fatal=mode == "strict",
        code=codes[0], warnings=tuple(warnings), rule=rule, details=tuple(lines),
    )


def _acceptance(rule: PairRule) -> str:
    if rule.measured_acceptance is None:
        return "(bench: failed its floor)"
    return f"{rule.measured_acceptance:.2f}"


# --- rules from speclane bench ---------------------------------------------------------------


class BenchFormatError(ValueError):
    """The bench JSON has no usable ``pairs`` section."""


def pair_rule_from_bench(entry: Mapping[str, Any], *, when: str | None = None) -> PairRule:
    """One bench ``pairs`` entry as an allow rule with its measured acceptance."""
    try:
        target, draft = str(entry["target"]), str(entry["draft"])
    except KeyError as e:
        raise BenchFormatError(f"a bench pair has no {e.args[0]!r}") from None
    families = {str(k): round(float(v), 3)
                for k, v in (entry.get("acceptance_by_family") or {}).items() if v is not None}
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


def pair_rules_from_bench(bench: Mapping[str, Any] | str, *,
                          when: str | None = None) -> tuple[PairRule, ...]:
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
        lines = [f"[[{SETTINGS_KEY}.pairs]]",
                 f"target = {_string(rule.target)}",
                 f"draft = {_string(rule.draft)}",
                 f"action = {_string(rule.action)}"]
        if rule.measured_acceptance is not None:
            lines.append(f"measured_acceptance = {_number(rule.measured_acceptance)}")
        if rule.acceptance_by_family:
            inner = ", ".join(f"{_key(k)} = {_number(v)}"
                              for k, v in sorted(rule.acceptance_by_family.items()))
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
