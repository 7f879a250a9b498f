"""Draft/target pair gating settings (the ``[gating]`` table): strict or graceful, per lane
and preset, and the pair rules (``[[gating.pairs]]``) that ``speclane bench`` writes."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field

from router.config.base import Frozen

SETTINGS_KEY = "gating"  # the speclane.toml table; messages name settings under it

GateMode = Literal["strict", "graceful"]

Fraction = Annotated[float, Field(ge=0.0, le=1.0)]


class PairRule(Frozen):
    """One ``[[gating.pairs]]`` entry. ``target`` / ``draft`` are model names (a model
    directory's name, a repo id, or a full path) or shell patterns (``Qwen2.5-*``)."""

    target: str = Field(min_length=1)
    draft: str = Field(min_length=1)
    action: Literal["allow", "deny"] = "allow"
    measured_acceptance: Fraction | None = None  # written by speclane bench
    acceptance_by_family: dict[str, Fraction] = Field(default_factory=dict)
    passed_floor: bool | None = None  # the bench's verdict against its own floor
    note: str = ""


class GatingSettings(Frozen):
    mode: GateMode = "graceful"
    # Per lane or external backend name ("speculative", "lmstudio", ...), and per preset.
    lane_modes: dict[str, GateMode] = Field(default_factory=dict)
    preset_modes: dict[str, GateMode] = Field(default_factory=dict)
    pairs: tuple[PairRule, ...] = ()
    acceptance_floor: Fraction = 0.3
    deny_below_floor: bool = True  # strict mode only: a pair measured below the floor is denied
    # Speculate only with pairs an allow rule names (validated by speclane bench).
    require_listed: bool = False
