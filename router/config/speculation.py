"""Configuration of the speculative auto-disable (``[spec]`` in speclane.toml, and the
per-policy ``[spec]`` overrides).

How the figures are used (router/speculation/autodisable.py):

- Acceptance is judged over a sliding window of the most recent ``window_size`` draft
  tokens (``window_unit = "tokens"``) or verification rounds (``"rounds"``), and only once
  the window holds ``min_sample`` of them. Speculation goes off when the windowed
  acceptance falls below ``off_threshold``; it comes back only after ``probes_to_enable``
  consecutive good probes, a probe being good at ``on_threshold`` or more. Two thresholds,
  so that acceptance wavering around one figure cannot flip the state back and forth.
- Speed is judged on the median decode speed (tokens/s after the first token) of the last
  ``speed_window`` speculative requests against the median of the last ``speed_window``
  non-speculative ones for the same model and workload. Speculation goes off when it is
  not at least ``off_speed_margin`` faster (0.05 = 5 %); a probe must be
  ``on_speed_margin`` faster to count as good.
- While off, a probe goes through speculation ``probe_initial`` seconds after the switch;
  each bad probe multiplies the spacing by ``probe_backoff`` up to ``probe_max``; after a
  good probe the next follows ``probe_min_spacing`` later. Two probe starts on one workload
  are never closer than ``probe_min_spacing``.
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field, model_validator

from router.config.base import Frozen

WindowUnit = Literal["tokens", "rounds"]

Fraction = Annotated[float, Field(ge=0.0, le=1.0)]
Margin = Annotated[float, Field(ge=0.0, le=10.0)]
Count = Annotated[int, Field(ge=1, le=10_000_000)]
Seconds = Annotated[float, Field(gt=0.0, le=7 * 86_400.0)]
Backoff = Annotated[float, Field(ge=1.0, le=100.0)]


class SpecSettings(Frozen):
    """Global auto-disable settings; a policy's ``SpecOverrides`` are merged on top."""

    # False: speculation stays as configured, statistics are still collected and shown.
    enabled: bool = True

    window_unit: WindowUnit = "tokens"
    # ~170 rounds at 3 draft tokens a round: a few requests' worth, so one odd answer does
    # not decide, yet a collapse is seen within a minute of traffic.
    window_size: Count = 512
    min_sample: Count = 128
    # Reported on Apple Silicon: ~50 % acceptance at k=3 was still ~1.2x faster than no
    # draft, while hard content ran 30 % slower. The speed check is the real arbiter; these
    # thresholds catch a collapse (0.000 acceptance for a whole run has been seen) before
    # enough speed samples exist.
    off_threshold: Fraction = 0.30
    on_threshold: Fraction = 0.45

    speed_window: Count = 16  # requests
    min_speed_samples: Count = 4
    # Shorter answers give a decode speed that is mostly noise.
    min_decode_tokens: Count = 16
    off_speed_margin: Margin = 0.05
    on_speed_margin: Margin = 0.10

    probe_min_spacing: Seconds = 10.0
    probe_initial: Seconds = 30.0
    probe_max: Seconds = 1800.0
    probe_backoff: Backoff = 2.0
    probes_to_enable: Annotated[int, Field(ge=1, le=100)] = 3
    # A probe that drafted fewer tokens says nothing about acceptance.
    probe_min_drafted: Count = 16
    # A probe that reports nothing within this time is counted as inconclusive.
    probe_timeout: Seconds = 300.0
    # While on and no baseline (non-speculative) speed is known for the model and workload,
    # ask for one request without speculation at most this often; 0 = never ask.
    baseline_spacing: Annotated[float, Field(ge=0.0, le=7 * 86_400.0)] = 120.0

    # Global only (not per policy):
    scrape_interval: Seconds = 15.0  # /metrics and /v1/status of cumulative backends
    max_keys: Annotated[int, Field(ge=1, le=100_000)] = 256  # (backend, model, workload) states

    @model_validator(mode="after")
    def _consistent(self) -> SpecSettings:
        problems = [
            msg
            for bad, msg in (
                (
                    self.on_threshold < self.off_threshold,
                    f"on_threshold ({self.on_threshold}) must be >= off_threshold "
                    f"({self.off_threshold})",
                ),
                (
                    self.on_speed_margin < self.off_speed_margin,
                    f"on_speed_margin ({self.on_speed_margin}) must be >= off_speed_margin "
                    f"({self.off_speed_margin})",
                ),
                (
                    self.min_sample > self.window_size,
                    f"min_sample ({self.min_sample}) must be <= window_size ({self.window_size})",
                ),
                (
                    self.min_speed_samples > self.speed_window,
                    f"min_speed_samples ({self.min_speed_samples}) must be <= speed_window "
                    f"({self.speed_window})",
                ),
                (
                    not self.probe_min_spacing <= self.probe_initial <= self.probe_max,
                    f"probe spacing must satisfy probe_min_spacing ({self.probe_min_spacing}) <= "
                    f"probe_initial ({self.probe_initial}) <= probe_max ({self.probe_max})",
                ),
            )
            if bad
        ]
        if problems:
            raise ValueError("; ".join(problems))
        return self

    def merged(self, overrides: SpecOverrides | None) -> SpecSettings:
        """These settings with a policy's overrides applied (validated again as a whole)."""
        if overrides is None:
            return self
        changes = overrides.model_dump(exclude_none=True)
        if not changes:
            return self
        return SpecSettings.model_validate({**self.model_dump(), **changes})


class SpecOverrides(Frozen):
    """Per-policy overrides of SpecSettings: every field optional (None = inherit).

    ``scrape_interval`` and ``max_keys`` are global and cannot be overridden.
    """

    enabled: bool | None = None
    window_unit: WindowUnit | None = None
    window_size: Count | None = None
    min_sample: Count | None = None
    off_threshold: Fraction | None = None
    on_threshold: Fraction | None = None
    speed_window: Count | None = None
    min_speed_samples: Count | None = None
    min_decode_tokens: Count | None = None
    off_speed_margin: Margin | None = None
    on_speed_margin: Margin | None = None
    probe_min_spacing: Seconds | None = None
    probe_initial: Seconds | None = None
    probe_max: Seconds | None = None
    probe_backoff: Backoff | None = None
    probes_to_enable: Annotated[int, Field(ge=1, le=100)] | None = None
    probe_min_drafted: Count | None = None
    probe_timeout: Seconds | None = None
    baseline_spacing: Annotated[float, Field(ge=0.0, le=7 * 86_400.0)] | None = None
