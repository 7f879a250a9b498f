"""Per-client concurrency limits: FIFO waiting, 429 with Retry-After, cancellation."""

from __future__ import annotations

import asyncio

import pytest

from router.kernel.errors import RouterError
from router.metrics import Metrics
from router.proxy.admission import ConcurrencyLimiter

LONG = 60.0  # a queue timeout the tests never reach


def sample(metrics: Metrics, name: str, **labels: str) -> float:
    value = metrics.registry.get_sample_value(name, labels)
    return 0.0 if value is None else value


async def until(condition: object) -> None:
    """Yield to the loop until ``condition()`` holds (no timer: the loop only runs tasks)."""
    for _ in range(1000):
        if condition():  # type: ignore[operator]
            return
        await asyncio.sleep(0)
    raise AssertionError("condition never became true")


class Holder:
    """A task that takes a slot, records it, and keeps it until released."""

    def __init__(
        self,
        limiter: ConcurrencyLimiter,
        name: str,
        order: list[str],
        limit: int | None = 1,
        queue_timeout: float = LONG,
    ) -> None:
        self.release = asyncio.Event()
        self.acquired = asyncio.Event()
        self.task = asyncio.create_task(self._run(limiter, name, order, limit, queue_timeout))

    async def _run(
        self,
        limiter: ConcurrencyLimiter,
        name: str,
        order: list[str],
        limit: int | None,
        queue_timeout: float,
    ) -> None:
        async with limiter.slot("c", limit, queue_timeout):
            order.append(name)
            self.acquired.set()
            await self.release.wait()


async def test_waiters_get_slots_in_arrival_order() -> None:
    limiter, order = ConcurrencyLimiter(), []
    first = Holder(limiter, "a", order)
    await first.acquired.wait()
    waiters = []
    for name in "bcd":
        waiters.append(Holder(limiter, name, order))
        await until(lambda: limiter.queued("c") == len(waiters))
    # A newcomer may not overtake the queue even when it arrives as a slot frees.
    first.release.set()
    late = Holder(limiter, "late", order)
    for holder in waiters:
        await holder.acquired.wait()
        assert limiter.active("c") == 1
        holder.release.set()
    late.release.set()
    await asyncio.gather(first.task, late.task, *(h.task for h in waiters))
    assert order == ["a", "b", "c", "d", "late"]
    assert (limiter.active("c"), limiter.queued("c")) == (0, 0)


async def test_limit_above_one_admits_that_many() -> None:
    limiter, order = ConcurrencyLimiter(), []
    holders = [Holder(limiter, str(i), order, limit=2) for i in range(3)]
    await holders[0].acquired.wait()
    await holders[1].acquired.wait()
    await until(lambda: limiter.queued("c") == 1)
    assert not holders[2].acquired.is_set()
    holders[0].release.set()
    await holders[2].acquired.wait()
    for h in holders:
        h.release.set()
    await asyncio.gather(*(h.task for h in holders))


async def test_queue_timeout_is_429_with_retry_after() -> None:
    metrics = Metrics()
    limiter, order = ConcurrencyLimiter(metrics), []
    holder = Holder(limiter, "a", order)
    await holder.acquired.wait()
    with pytest.raises(RouterError) as info:
        async with limiter.slot("c", 1, 0.05):
            pass
    err = info.value
    assert (err.status, err.code, err.type) == (
        429,
        "concurrency_limit_exceeded",
        "rate_limit_error",
    )
    assert int(err.headers["Retry-After"]) >= 1
    assert err.headers["X-Speclane-Client"] == "c"
    assert sample(metrics, "speclane_rejections_total", client="c", status="429") == 1
    assert sample(metrics, "speclane_queue_depth", client="c") == 0
    assert sample(metrics, "speclane_queue_wait_seconds_count", client="c") == 2
    assert sample(metrics, "speclane_queue_wait_seconds_sum", client="c") >= 0.05
    holder.release.set()
    await holder.task
    assert limiter.active("c") == 0


async def test_zero_timeout_rejects_at_once_when_full() -> None:
    limiter, order = ConcurrencyLimiter(), []
    holder = Holder(limiter, "a", order)
    await holder.acquired.wait()
    with pytest.raises(RouterError):
        async with limiter.slot("c", 1, 0):
            pass
    assert limiter.queued("c") == 0
    holder.release.set()
    await holder.task


async def test_retry_after_follows_how_long_slots_are_held() -> None:
    now = [0.0]
    limiter = ConcurrencyLimiter(clock=lambda: now[0])
    async with limiter.slot("c", 1, LONG):
        now[0] += 7.2  # a request that held its slot for 7.2 s
    order: list[str] = []
    holder = Holder(limiter, "a", order)
    await holder.acquired.wait()
    with pytest.raises(RouterError) as info:
        async with limiter.slot("c", 1, 0):
            pass
    assert info.value.headers["Retry-After"] == "8"
    holder.release.set()
    await holder.task


async def test_cancelled_waiter_leaves_the_queue_at_once() -> None:
    metrics = Metrics()
    limiter, order = ConcurrencyLimiter(metrics), []
    holder = Holder(limiter, "a", order)
    await holder.acquired.wait()
    gone = Holder(limiter, "gone", order)
    await until(lambda: limiter.queued("c") == 1)
    assert sample(metrics, "speclane_queue_depth", client="c") == 1
    gone.task.cancel()  # what the server does when the client disconnects
    with pytest.raises(asyncio.CancelledError):
        await gone.task
    assert limiter.queued("c") == 0
    assert sample(metrics, "speclane_queue_depth", client="c") == 0
    holder.release.set()
    await holder.task
    assert limiter.active("c") == 0  # no slot leaked to the cancelled waiter
    next_one = Holder(limiter, "next", order)
    await next_one.acquired.wait()
    next_one.release.set()
    await next_one.task
    assert order == ["a", "next"]


async def test_a_slot_handed_to_a_waiter_cancelled_in_the_same_instant_is_passed_on() -> None:
    limiter, order = ConcurrencyLimiter(), []
    async with limiter.slot("c", 1, LONG):
        doomed = Holder(limiter, "doomed", order)
        await until(lambda: limiter.queued("c") == 1)
        after = Holder(limiter, "after", order)
        await until(lambda: limiter.queued("c") == 2)
    # Leaving the block handed the slot to "doomed", whose task has not run yet.
    doomed.task.cancel()
    await after.acquired.wait()
    assert limiter.active("c") == 1
    after.release.set()
    await asyncio.gather(after.task, doomed.task, return_exceptions=True)
    assert doomed.task.cancelled()
    assert order == ["after"]
    assert limiter.active("c") == 0


async def test_an_error_in_the_body_releases_the_slot() -> None:
    limiter = ConcurrencyLimiter()
    with pytest.raises(RuntimeError):
        async with limiter.slot("c", 1, LONG):
            raise RuntimeError("upstream failed")
    assert limiter.active("c") == 0


async def test_no_limit_never_waits_and_clients_are_independent() -> None:
    limiter, order = ConcurrencyLimiter(), []
    holders = [Holder(limiter, str(i), order, limit=None) for i in range(5)]
    for h in holders:
        await h.acquired.wait()
    async with limiter.slot("other", 1, 0) as waited:
        assert waited == 0
    for h in holders:
        h.release.set()
    await asyncio.gather(*(h.task for h in holders))


async def test_a_raised_limit_serves_waiters_before_newcomers() -> None:
    limiter, order = ConcurrencyLimiter(), []
    holder = Holder(limiter, "a", order)
    await holder.acquired.wait()
    waiter = Holder(limiter, "b", order)
    await until(lambda: limiter.queued("c") == 1)
    newcomer = Holder(limiter, "c", order, limit=2)  # a policy reload raised the limit
    await waiter.acquired.wait()
    await until(lambda: limiter.queued("c") == 1)
    assert not newcomer.acquired.is_set()  # the freed slot went to the earlier waiter
    holder.release.set()
    await newcomer.acquired.wait()
    assert order == ["a", "b", "c"]
    for h in (waiter, newcomer):
        h.release.set()
    await asyncio.gather(holder.task, waiter.task, newcomer.task)
    assert limiter.active("c") == 0
