"""Which loaded models to unload (pure): to make room for a model about to load, and when
an idle model's time to live has passed.

Each model's memory is the layout estimate of its lanes (``router.lanes.layout.estimate``).
A model is evictable when it is loaded, not pinned and has no request in flight (a model
loading or with a stream open is never unloaded). To make room, the least recently used
evictable models go first, and only as many as needed; when even unloading all of them
would not make room, nothing is unloaded and the caller waits (or answers 503 naming the
models that hold the memory). When even the pinned models alone leave no room (they are never
unloaded) no wait can end well: the plan says so (``blocked_by_pinned``) and the caller
answers at once.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Resident:
    """One model holding memory: loaded, or loading (its memory is reserved)."""

    name: str
    estimate_bytes: int
    last_used: float  # monotonic seconds
    in_flight: int = 0
    pinned: bool = False
    loading: bool = False

    @property
    def evictable(self) -> bool:
        return not self.pinned and not self.loading and self.in_flight == 0


@dataclass(frozen=True, slots=True)
class RoomPlan:
    evict: tuple[str, ...]  # unload these, least recently used first, then load
    fits: bool  # after ``evict``, the new model fits
    never_fits: bool  # it exceeds the limit alone: no eviction helps
    holders: tuple[str, ...]  # when it does not fit: the models holding memory
    used_bytes: int  # held before any eviction
    need_bytes: int
    limit_bytes: int
    # It does not fit beside the pinned models alone: waiting for others to idle is futile.
    blocked_by_pinned: bool = False


def make_room(need: int, limit: int, residents: Sequence[Resident]) -> RoomPlan:
    """The models to unload so that ``need`` more bytes fit under ``limit``."""
    used = sum(r.estimate_bytes for r in residents)

    def plan(evict: tuple[str, ...], fits: bool, holders: tuple[str, ...] = ()) -> RoomPlan:
        return RoomPlan(evict, fits, need > limit, holders, used, need, limit)

    if need > limit:
        return plan((), False)
    if used + need <= limit:
        return plan((), True)
    evictable = sorted((r for r in residents if r.evictable), key=lambda r: (r.last_used, r.name))
    remaining, chosen = used, []
    for r in evictable:
        chosen.append(r.name)
        remaining -= r.estimate_bytes
        if remaining + need <= limit:
            return plan(tuple(chosen), True)
    holders = tuple(sorted(r.name for r in residents if r.estimate_bytes > 0))
    pinned = sum(r.estimate_bytes for r in residents if r.pinned)
    if pinned + need > limit:
        pinned_names = tuple(sorted(r.name for r in residents if r.pinned))
        return RoomPlan((), False, False, pinned_names, used, need, limit, blocked_by_pinned=True)
    return plan((), False, holders)


@dataclass(frozen=True, slots=True)
class Idle:
    """A loaded model's idle state, for the TTL check."""

    name: str
    last_used: float
    ttl: float  # seconds; 0: never expires
    in_flight: int = 0
    pinned: bool = False
    # An explicit idle deadline (Ollama's keep_alive) wins over the TTL; a pinned model
    # stays whatever a request asks.
    deadline: float | None = None


def expired(now: float, models: Sequence[Idle]) -> list[str]:
    """The idle models whose time to live has passed, the least recently used first."""
    out = []
    for m in sorted(models, key=lambda m: (m.last_used, m.name)):
        if m.pinned or m.in_flight > 0:
            continue
        if m.deadline is not None:
            if now >= m.deadline:
                out.append(m.name)
        elif m.ttl > 0 and now - m.last_used >= m.ttl:
            out.append(m.name)
    return out


def check_interval(ttls: Sequence[float], longest: float = 5.0, shortest: float = 0.1) -> float:
    """How often the TTL check runs: often enough for the shortest TTL to be kept to within
    about a quarter of it, never more often than ``shortest``."""
    positive = [t for t in ttls if t > 0]
    if not positive:
        return longest
    return max(shortest, min(longest, min(positive) / 4))
