"""Is speculation actually happening on a backend? (pure)

A backend configured as speculative that reports no draft tokens over a window of
responses is flagged, instead of silently looking like 0 % acceptance (speculation configured
but stripped by a server, or 0.0 acceptance for a whole run, have both been seen).

Some servers never put draft statistics on the wire whatever they run (``mlx_lm.server``
keeps ``from_draft`` internal, Ollama drops llama-server's ``draft_n``): for those kinds a
configured draft "cannot be observed on this backend", a state of its own, never the
"reported no draft tokens" of a server that could have reported them and did not.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from typing import Any, Literal

from router.speculation.parsers import SILENT_KINDS

# What /admin/lanes and /admin/spec say about a backend's speculation, and the value of
# the speclane_spec_observed gauge for each (no sample while "pending" or "not_requested").
Observation = Literal["observed", "not_observed", "pending", "unobservable", "not_requested"]
GAUGE: dict[Observation, int] = {"observed": 1, "not_observed": 0, "unobservable": -1}


def observable(kind: str) -> bool:
    """The backend kind can report draft statistics (per response or cumulative)."""
    return kind not in SILENT_KINDS


def unobservable_reason(kind: str) -> str:
    return (
        f"cannot be observed on this backend: {kind} does not report draft statistics; "
        "the draft may well be running, speclane cannot tell or auto-disable it"
    )


def observation(kind: str, requested: bool, observed: bool | None) -> Observation:
    if not requested:
        return "not_requested"
    if not observable(kind):
        return "unobservable"
    if observed is None:
        return "pending"
    return "observed" if observed else "not_observed"


def speculation_status(
    *,
    kind: str,
    lane: str | None,
    requested: bool,
    active: bool,
    observed: bool | None,
    reason: str | None,
    mode: str | None = None,
) -> dict[str, Any]:
    """One backend's speculation as both admin views show it (so that they agree)."""
    state = observation(kind, requested, observed)
    return {
        "mode": mode,
        "requested": requested,
        "active": active if lane is not None else None,
        "observable": observable(kind),
        "observation": state,
        "observed": None if state == "unobservable" else observed,
        "reason": unobservable_reason(kind) if state == "unobservable" else reason,
    }


@dataclass
class ObservedWindow:
    size: int = 20
    _drafted: deque[bool] = field(default_factory=deque)

    def add(self, drafted_any: bool) -> None:
        self._drafted.append(drafted_any)
        while len(self._drafted) > self.size:
            self._drafted.popleft()

    @property
    def observed(self) -> bool | None:
        """True: drafts seen in the window; False: a full window without any; None: too few."""
        if any(self._drafted):
            return True
        return False if len(self._drafted) >= self.size else None

    def reason(self) -> str | None:
        if self.observed is False:
            return (
                f"configured as speculative but reported no draft tokens in the last "
                f"{self.size} responses"
            )
        return None
