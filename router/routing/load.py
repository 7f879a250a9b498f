"""Lane facts for the routing decision (pure): availability, load, and the load gate's
hysteresis. ``router.routing.classify`` turns them into ordered candidates."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, replace

from router.config.routing import RoutingRules
from router.routing.types import BackendView, Candidate


def available(view: BackendView) -> bool:
    return view.ready and not view.cooled_down


def candidate_for(view: BackendView) -> Candidate:
    return Candidate(backend=view.name, lane=view.lane or view.name, speculative=view.speculative)


def lane_load(view: BackendView) -> int:
    """Requests on a backend: at least what speclane relays to it and what it reports waiting.

    ``inflight`` already counts the requests a worker holds in its own queue, so adding the
    worker's ``queued`` would count them twice; the larger of the two is the honest figure
    (the worker's report can run ahead of speclane's count only while a snapshot lags).
    """
    return max(view.inflight, view.queued)


def waiting(load: int, capacity: int) -> int:
    """Requests that must finish before a new one starts on a lane with ``load`` requests
    that decodes ``capacity`` at once (affinity's balance and pace placement alike)."""
    return max(0, load + 1 - capacity)


def lanes_load(views: Iterable[BackendView]) -> int:
    """The load on speclane's own two lanes, which share one machine's compute."""
    return sum(lane_load(v) for v in views if v.lane is not None)


@dataclass(frozen=True, slots=True)
class LoadGate:
    """Hysteresis on the two lanes' total load: may new requests take the speculative lane?

    Speculation spends extra compute (drafting, verifying) on a machine whose two lanes
    share it, so it pays while the machine is otherwise quiet: vllm-mlx's HybridEngine
    decodes speculatively while fewer than 2 requests are active and switches back only at
    0. The gate turns busy when the load reaches ``busy_at`` and free again only when it
    falls to ``free_at``, so a load hovering around one threshold does not flap. The
    defaults (3, 1) keep every lone request speculative as HybridEngine does, and unlike
    it do not lose speculation for good behind one long-running batch request.
    (The speculative lane itself never queues a request behind another: ``classify``.)
    """

    busy_at: int = 3
    free_at: int = 1
    busy: bool = False

    def __post_init__(self) -> None:
        if not 0 <= self.free_at < self.busy_at:
            raise ValueError(f"need 0 <= free_at < busy_at, got {self.free_at}, {self.busy_at}")

    def observe(self, load: int) -> LoadGate:
        """The state after seeing ``load``: call on every decision and load change."""
        busy = load > self.free_at if self.busy else load >= self.busy_at
        return self if busy == self.busy else replace(self, busy=busy)


def gate_for(rules: RoutingRules) -> LoadGate:
    """A free gate with the configured thresholds."""
    return LoadGate(busy_at=rules.spec_busy_at, free_at=rules.spec_free_at)
