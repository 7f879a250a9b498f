"""Per-client concurrency limits: a FIFO queue per client, 429 with Retry-After past the wait.

``async with limiter.slot(client, limit, timeout):`` holds one of the client's ``limit``
slots for the body. Past the limit the request waits its turn (strict FIFO: a newcomer
never overtakes a waiter) for at most ``queue_timeout`` seconds, then gets a 429 ``RouterError``.
A waiter that is cancelled (its client disconnected and the handler task was cancelled)
leaves the queue at once; a slot handed to it in that same instant is passed on.
The limit is read on every call, so a policy reload takes effect on the next request.
"""

from __future__ import annotations

import asyncio
import math
import time
from collections import deque
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field

from router.config.names import CLIENT_HEADER
from router.kernel.errors import RouterError
from router.metrics import Metrics

RETRY_AFTER_MAX = 60  # seconds; OpenAI SDKs honour Retry-After only up to about a minute


@dataclass(slots=True)
class _Client:
    limit: int | None = None
    active: int = 0
    waiters: deque[asyncio.Future[None]] = field(default_factory=deque)
    hold_ewma: float | None = None  # how long a slot is typically held, for Retry-After


class ConcurrencyLimiter:
    def __init__(
        self, metrics: Metrics | None = None, *, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self._metrics = metrics
        self._clock = clock
        self._clients: dict[str, _Client] = {}

    def active(self, client: str) -> int:
        state = self._clients.get(client)
        return state.active if state else 0

    def queued(self, client: str) -> int:
        state = self._clients.get(client)
        return sum(not w.done() for w in state.waiters) if state else 0

    @asynccontextmanager
    async def slot(
        self, client: str, limit: int | None, queue_timeout: float
    ) -> AsyncIterator[float]:
        """Hold a slot for the body; yields the seconds spent waiting for it."""
        state = self._clients.setdefault(client, _Client())
        state.limit = limit
        self._fill(state)  # a raised limit serves the waiters first
        waited = 0.0
        if not state.waiters and (limit is None or state.active < limit):
            state.active += 1
        else:
            started = self._clock()
            await self._wait(client, state, queue_timeout)
            waited = self._clock() - started
        if self._metrics:
            self._metrics.queue_wait.labels(client).observe(waited)
        held_from = self._clock()
        try:
            yield waited
        finally:
            self._note_hold(state, self._clock() - held_from)
            self._release(state)

    async def _wait(self, client: str, state: _Client, queue_timeout: float) -> None:
        waiter: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        state.waiters.append(waiter)
        started = self._clock()
        depth = self._metrics.queue_depth.labels(client) if self._metrics else None
        if depth:
            depth.inc()
        try:
            async with asyncio.timeout(queue_timeout):
                await waiter
        except TimeoutError:
            if not _granted(waiter):
                self._reject(client, state, waiter, self._clock() - started)
            # else: the slot arrived as the time ran out; keep it
        except BaseException:
            if _granted(waiter):
                self._release(state)
            else:
                _discard(state, waiter)
            raise
        finally:
            if depth:
                depth.dec()

    def _reject(
        self, client: str, state: _Client, waiter: asyncio.Future[None], waited: float
    ) -> None:
        _discard(state, waiter)
        if self._metrics:
            self._metrics.queue_wait.labels(client).observe(waited)
            self._metrics.rejections.labels(client, "429").inc()
        retry_after = min(RETRY_AFTER_MAX, max(1, math.ceil(state.hold_ewma or 1)))
        raise RouterError(
            429,
            f"too many concurrent requests for client '{client}' "
            f"(limit {state.limit}); retry after {retry_after} s",
            type="rate_limit_error",
            code="concurrency_limit_exceeded",
            headers={"Retry-After": str(retry_after), CLIENT_HEADER: client},
        )

    def _release(self, state: _Client) -> None:
        state.active -= 1
        self._fill(state)

    def _fill(self, state: _Client) -> None:
        """Hand free slots to waiters in arrival order."""
        while state.waiters and (state.limit is None or state.active < state.limit):
            waiter = state.waiters.popleft()
            if not waiter.done():
                waiter.set_result(None)
                state.active += 1

    @staticmethod
    def _note_hold(state: _Client, seconds: float) -> None:
        previous = state.hold_ewma
        state.hold_ewma = seconds if previous is None else 0.8 * previous + 0.2 * seconds


def _granted(waiter: asyncio.Future[None]) -> bool:
    return waiter.done() and not waiter.cancelled()


def _discard(state: _Client, waiter: asyncio.Future[None]) -> None:
    waiter.cancel()
    try:
        state.waiters.remove(waiter)
    except ValueError:
        pass
