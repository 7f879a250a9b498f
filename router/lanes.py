"""Choose where a request goes: pure, (request, backend snapshot) -> ordered candidates.

This is the core rule set: any ready backend that serves the model, least busy first,
cooled-down backends only as a last resort. The classification step refines it.
"""

from __future__ import annotations

from collections.abc import Iterable

from router.decision import BackendView, Candidate, Decision, RouteRequest


class NoRoute(Exception):
    def __init__(self, reason: str, *, unknown_model: bool) -> None:
        super().__init__(reason)
        self.reason = reason
        self.unknown_model = unknown_model


def serves(view: BackendView, model: str) -> bool:
    return model in view.models


def candidate_for(view: BackendView) -> Candidate:
    return Candidate(backend=view.name, lane=view.lane or view.name, speculative=view.speculative)


def choose(request: RouteRequest, backends: Iterable[BackendView]) -> Decision:
    serving = [b for b in backends if serves(b, request.model)]
    if not serving:
        raise NoRoute(f"no backend serves model '{request.model}'", unknown_model=True)
    ready = sorted((b for b in serving if b.ready and not b.cooled_down), key=_load)
    cooled = sorted((b for b in serving if b.ready and b.cooled_down), key=_load)
    if not ready and not cooled:
        raise NoRoute(f"no backend serving '{request.model}' is ready", unknown_model=False)
    reason = "least-busy" if ready else "all-cooled-down->last-resort"
    return Decision(tuple(candidate_for(b) for b in (*ready, *cooled)), reason)


def _load(view: BackendView) -> tuple[int, str]:
    return (view.inflight + view.queued, view.name)
