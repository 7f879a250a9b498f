"""The state kept per (backend, model, workload, source) by the auto-disable, and its JSON view.

The workload is ``<client>:<preset>:<family>`` (``router.speculation.families``) and the source
what drafts (``draft_model``, ``prompt_lookup``, ``suffix``, ``prediction``): the state is per
(backend, model, client, preset, family, source), and the view shows the parts.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal, NamedTuple

from router.config.speculation import SpecSettings
from router.speculation.families import workload_parts
from router.speculation.probes import ProbeSchedule
from router.speculation.window import AcceptanceWindow, SpeedWindow, WindowEntry


class SpecKey(NamedTuple):
    backend: str
    model: str
    workload: str
    # What drafts (``router.routing.speculate.request_sources``): one workload may pay with
    # prompt lookup and not with the draft model, so each source is judged on its own.
    source: str = "draft_model"


State = Literal["on", "off"]
OffReason = Literal["low_acceptance", "not_faster"]


@dataclass
class KeyState:
    """Everything known about one (backend, model, workload, source)."""

    key: SpecKey
    settings: SpecSettings
    acceptance: AcceptanceWindow
    speed: SpeedWindow
    since: float
    state: State = "on"
    off_reason: OffReason | None = None
    changes: int = 0
    probe: ProbeSchedule = field(default_factory=ProbeSchedule)
    good_streak: int = 0
    series: list[tuple[WindowEntry | None, float | None]] = field(default_factory=list)
    last_enabled_at: float | None = None
    baseline_ticket: int | None = None
    baseline_asked_at: float | None = None

    def describe(self, now: float, base: float | None, scope: str | None) -> dict[str, Any]:
        """JSON-ready figures for ``GET /admin/spec``; ``base``: the baseline speed median
        and ``scope`` which window it came from ("workload", "model" or None)."""
        s, probe, key = self.settings, self.probe, self.key
        fig = self.acceptance.figures()
        spec = self.speed.median(s.min_speed_samples)
        reason = (self.off_reason or "on") if s.enabled else "auto_disable_off"
        return {
            "backend": key.backend,
            "model": key.model,
            "workload": key.workload,
            **workload_parts(key.workload),
            "source": key.source,
            "state": self.state,
            "reason": reason,
            "since": self.since,
            "for_seconds": _r(now - self.since),
            "changes": self.changes,
            "window": {
                "unit": s.window_unit,
                "size": s.window_size,
                "min_sample": s.min_sample,
                "units": fig.units,
                "drafted": fig.drafted,
                "accepted": fig.accepted,
                "requests": fig.entries,
                "acceptance": _r(fig.acceptance),
                "judging": fig.units >= s.min_sample,
            },
            "speed": {
                "spec_tps": _r(spec),
                "spec_samples": len(self.speed),
                "baseline_tps": _r(base),
                "baseline_scope": scope,
                "ratio": _r(spec / base) if spec is not None and base else None,
                "min_samples": s.min_speed_samples,
            },
            "thresholds": {
                "off": s.off_threshold,
                "on": s.on_threshold,
                "off_speed_margin": s.off_speed_margin,
                "on_speed_margin": s.on_speed_margin,
            },
            "probe": {
                "next_at": probe.next_at,
                "next_in": None if probe.next_at is None else _r(max(0.0, probe.next_at - now)),
                "spacing": probe.spacing if self.state == "off" else None,
                "in_flight": probe.ticket is not None,
                "good_streak": self.good_streak,
                "needed": s.probes_to_enable,
                "sent": probe.sent,
                "last_outcome": probe.last_outcome,
            },
        }


def _r(value: float | None) -> float | None:
    return None if value is None else round(value, 4)
