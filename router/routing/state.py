"""What one routing decision leaves for the next (kept on the app, read and replaced by the
handler): the load gate's hysteresis state, the cache-affinity map and the prefix watch."""

from __future__ import annotations

from dataclasses import dataclass, field

from router.routing.affinity import AffinityMap
from router.routing.load import LoadGate
from router.routing.pace import PaceBook
from router.routing.prefixwatch import PrefixWatch


@dataclass
class RoutingState:
    """What one decision leaves for the next: the load gate's hysteresis state, and which
    lane last served each conversation prefix (cache-aware routing)."""

    gate: LoadGate = field(default_factory=LoadGate)
    affinity: AffinityMap = field(default_factory=AffinityMap)
    # what each conversation's previous request left in its lane's cache (prefix breaks)
    prefixes: PrefixWatch = field(default_factory=PrefixWatch)
    # each lane's measured decode and first-token pace (where a turn finishes first)
    paces: PaceBook = field(default_factory=PaceBook)
