"""The thresholds of the request-shape rules and of the load gate (the ``[routing]`` table)."""

from __future__ import annotations

from pydantic import Field, model_validator

from router.config.base import Frozen


class RoutingRules(Frozen):
    """The thresholds of the request-shape rules and of the load gate (configuration)."""

    long_prompt_chars: int = Field(default=16_000, ge=0)  # 0: no limit
    spec_max_temperature: float = Field(default=1.0, ge=0)
    short_output_tokens: int = Field(default=16, ge=0)  # 0: rule off
    spec_busy_at: int = Field(default=3, ge=1)
    spec_free_at: int = Field(default=1, ge=0)
    cache_affinity: bool = True  # a conversation goes back to the lane holding its prefix
    affinity_abs_threshold: int = Field(default=1, ge=0)  # load overrides affinity past both
    affinity_rel_threshold: float = Field(default=1.5, ge=1.0)
    # A turn leaves the lane holding its prefix when the lanes' measured pace says it
    # finishes sooner on the other by more than pace_margin (router.routing.pace).
    pace_placement: bool = True
    pace_margin: float = Field(default=0.15, ge=0.0, lt=1.0)

    @model_validator(mode="after")
    def _gate_order(self) -> RoutingRules:
        if self.spec_free_at >= self.spec_busy_at:
            raise ValueError("spec_free_at must be below spec_busy_at")
        return self
