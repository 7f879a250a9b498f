"""Counters a lane worker reports in /health, turned into the router's Prometheus metrics.

A worker's counters (prompt-cache lookups, reused and prefilled tokens, the disk tier's
hits, writes, drops, refusals and evictions) are cumulative
since it started; the router's counters must survive worker restarts. Each health check
adds the increase since the previous one (``increase``, pure); a counter that went down
is a new worker process, whose whole value is new.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from router.metrics import Metrics

DISK_EVENTS = ("hits", "writes", "dropped", "refused", "evicted")  # the disk tier's counters
CACHE_FIELDS = (
    "lookups",
    "hits",
    "reused_tokens",
    "prefilled_tokens",
    *(f"disk_{event}" for event in DISK_EVENTS),
)


def cache_counters(health: Mapping[str, Any] | None) -> dict[str, int]:
    """The prompt-cache counters of a /health body (missing or malformed: none)."""
    block = health.get("prompt_cache") if isinstance(health, Mapping) else None
    if not isinstance(block, Mapping):
        return {}
    out: dict[str, int] = {}
    disk = block.get("disk")
    disk = disk if isinstance(disk, Mapping) else {}
    fields = [(key, block.get(key)) for key in (*CACHE_FIELDS, "bytes")]
    fields += [(f"disk_{key}", disk.get(key)) for key in (*DISK_EVENTS, "bytes")]
    for key, value in fields:
        if isinstance(value, int) and not isinstance(value, bool) and value >= 0:
            out[key] = value
    return out


def increase(previous: Mapping[str, int], current: Mapping[str, int]) -> dict[str, int]:
    """Per counter, what was added since ``previous`` (a decrease: a restarted worker)."""
    out: dict[str, int] = {}
    for key in CACHE_FIELDS:
        if key not in current:
            continue
        now, before = current[key], previous.get(key, 0)
        out[key] = now - before if now >= before else now
    return out


class WorkerFigures:
    """Exports one lane's worker counters; call ``observe`` with every /health body."""

    def __init__(self, lane: str, metrics: Metrics | None) -> None:
        self.lane = lane
        self._metrics = metrics
        self._last: dict[str, int] = {}
        self._pid: object = None

    def observe(self, health: Mapping[str, Any] | None) -> None:
        current = cache_counters(health)
        if not current or self._metrics is None:
            return
        pid = health.get("pid") if isinstance(health, Mapping) else None
        if pid != self._pid:  # a new worker process: its counters start from zero
            self._pid, self._last = pid, {}
        added = increase(self._last, current)
        self._last = current
        m, lane = self._metrics, self.lane
        if added.get("reused_tokens"):
            m.prompt_cache_tokens.labels(lane, "reused").inc(added["reused_tokens"])
        if added.get("prefilled_tokens"):
            m.prompt_cache_tokens.labels(lane, "prefilled").inc(added["prefilled_tokens"])
        hits, lookups = added.get("hits", 0), added.get("lookups", 0)
        if hits:
            m.prompt_cache_lookups.labels(lane, "hit").inc(hits)
        if lookups > hits:
            m.prompt_cache_lookups.labels(lane, "miss").inc(lookups - hits)
        if "bytes" in current:
            m.prompt_cache_bytes.labels(lane).set(current["bytes"])
        for event in DISK_EVENTS:
            if added.get(f"disk_{event}"):
                m.prompt_cache_disk.labels(lane, event).inc(added[f"disk_{event}"])
        if "disk_bytes" in current:
            m.prompt_cache_disk_bytes.labels(lane).set(current["disk_bytes"])
