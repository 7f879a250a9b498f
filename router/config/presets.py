"""Presets: named request classes (``interactive``, ``throughput``, ...) from configuration.

A client selects one with the ``X-Speclane-Preset`` header or a ``model@preset`` suffix.
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from router.config.base import Frozen

LanePreference = Literal["speculative", "batching", "auto"]


class PresetSpec(Frozen):
    lane: LanePreference = "auto"
    # Request defaults applied when the client did not set the field itself.
    defaults: dict[str, float | int | str | bool] = Field(default_factory=dict)


DEFAULT_PRESETS: dict[str, PresetSpec] = {
    "interactive": PresetSpec(lane="speculative"),
    "throughput": PresetSpec(lane="batching"),
}
