"""Pure parts of the lane supervisor: lane states, the status snapshot, the restart budget.

No I/O here: time and randomness come in as arguments so the restart policy can be
tested without processes or clocks.
"""

from __future__ import annotations

import enum
from collections import deque
from dataclasses import dataclass
from typing import Any, Literal

# Why a worker was restarted (the ``reason`` label of speclane_worker_restarts_total).
RestartReason = Literal["exited", "hung", "stalled", "start_failed"]


class LaneState(enum.Enum):
    STARTING = "starting"  # a worker process is spawned and not yet answering /health
    READY = "ready"  # the worker answers /health; requests may be sent to base_url
    DOWN = "down"  # the worker died or hung; a restart is pending (backoff)
    STOPPED = "stopped"  # not started yet, or stopped on purpose
    FAILED = "failed"  # could not start, or restarted too often: given up


# Every state change a lane may make (llama-swap's isValidTransition is the model). Anything
# else is a supervisor bug: ``check_transition`` raises, so a test catches it.
TRANSITIONS: dict[LaneState, frozenset[LaneState]] = {
    LaneState.STOPPED: frozenset({LaneState.STARTING, LaneState.FAILED}),  # spawn, or spawn fails
    LaneState.STARTING: frozenset(
        {LaneState.READY, LaneState.DOWN, LaneState.FAILED, LaneState.STOPPED}
    ),
    LaneState.READY: frozenset({LaneState.DOWN, LaneState.STOPPED, LaneState.FAILED}),
    LaneState.DOWN: frozenset({LaneState.STARTING, LaneState.FAILED, LaneState.STOPPED}),
    LaneState.FAILED: frozenset({LaneState.STARTING, LaneState.STOPPED}),  # start again, stop
}


class InvalidTransition(RuntimeError):
    """A lane state change the table does not allow: a bug in the supervisor."""


def check_transition(lane: str, old: LaneState, new: LaneState) -> None:
    if new is not old and new not in TRANSITIONS[old]:
        raise InvalidTransition(f"{lane} lane: invalid state change {old.value} -> {new.value}")


@dataclass(frozen=True)
class LaneStatus:
    lane: str
    state: LaneState = LaneState.STOPPED
    base_url: str | None = None  # http://127.0.0.1:PORT/v1 while the worker is up
    pid: int | None = None
    health: dict[str, Any] | None = None  # the last GET /health body of the current worker
    restarts: int = 0
    last_error: str | None = None

    @property
    def ready(self) -> bool:
        return self.state is LaneState.READY

    def to_dict(self) -> dict[str, Any]:
        return {
            "lane": self.lane,
            "state": self.state.value,
            "base_url": self.base_url,
            "pid": self.pid,
            "health": self.health,
            "restarts": self.restarts,
            "last_error": self.last_error,
        }


class RestartBudget:
    """At most ``max_restarts`` restarts within any ``window`` seconds.

    A worker that keeps dying is given up instead of being restarted forever
    (llama-swap users asked for restarts; nobody wants a hot crash loop).
    """

    def __init__(self, max_restarts: int, window: float) -> None:
        if max_restarts < 0 or window <= 0:
            raise ValueError("max_restarts must be >= 0 and window > 0")
        self.max_restarts = max_restarts
        self.window = window
        self._times: deque[float] = deque()

    def _forget_before(self, now: float) -> None:
        while self._times and self._times[0] <= now - self.window:
            self._times.popleft()

    def recent(self, now: float) -> int:
        """Restarts within the window ending at ``now``."""
        self._forget_before(now)
        return len(self._times)

    def exhausted(self, now: float) -> bool:
        """True when one more restart would exceed the budget."""
        return self.recent(now) >= self.max_restarts

    def record(self, now: float) -> None:
        self._times.append(now)


def backoff_delay(recent_restarts: int, initial: float, maximum: float, rand: float) -> float:
    """Jittered exponential delay before the next restart.

    The exponent is the number of restarts inside the window rather than a lifetime
    attempt counter, so a worker that ran well for a whole window restarts quickly
    again. ``rand`` in [0, 1) spreads the delay over [base/2, base] ("equal jitter"):
    never immediate, never synchronised with the other lane.
    """
    base = min(maximum, initial * 2.0 ** min(recent_restarts, 32))
    return base * (0.5 + 0.5 * rand)


def lane_health(health: dict[str, Any] | None, lane: str) -> dict[str, Any] | None:
    """One lane's view of a worker's /health: the body itself for a one-lane worker; for a
    shared one (``{"mode": "shared", "lanes": {lane: {...}}, ...}``) that lane's block."""
    if health is None or not isinstance(health.get("lanes"), dict):
        return health
    block = health["lanes"].get(lane)
    return block if isinstance(block, dict) else None


@dataclass
class StallWatch:
    """A worker that answers /health but makes no progress while it has work: its generation
    thread is stuck (a request would only time out, and the next one with it). ``observe``
    each health answer; it returns how long the worker has been busy without progress
    (``progress_tokens`` unchanged while a request is active or queued), 0 while it moves or
    idles. A health answer without ``progress_tokens`` is never judged."""

    since: float | None = None
    progress: int | None = None

    def observe(self, blocks: list[dict[str, Any] | None], now: float) -> float:
        busy, progress = 0, 0
        for block in blocks:
            if block is None or not isinstance(block.get("progress_tokens"), int):
                self.since = None
                return 0.0
            busy += int(block.get("active") or 0) + int(block.get("queued") or 0)
            progress += block["progress_tokens"]
        if not busy:
            self.since = None  # idle: the clock starts when work arrives
            return 0.0
        if progress != self.progress or self.since is None:
            self.progress, self.since = progress, now
            return 0.0
        return now - self.since
