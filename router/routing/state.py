"""What one routing decision leaves for the next (kept on the app, read and replaced by the
handler): the load gate's hysteresis state and the cache-affinity map."""

from __future__ import annotations

from dataclasses import dataclass, field

from router.routing.affinity import AffinityMap
from router.routing.load import LoadGate


@dataclass
class RoutingState:
    """What one decision leaves for the next: the load gate's hysteresis state, and which
    lane last served each conversation prefix (cache-aware routing)."""

    gate: LoadGate = field(default_factory=LoadGate)
    affinity: AffinityMap = field(default_factory=AffinityMap)
