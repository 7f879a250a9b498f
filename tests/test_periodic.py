"""router.periodic: one background task running a step every interval until stopped."""

from __future__ import annotations

import asyncio

import pytest

from router.periodic import Periodic


async def test_steps_repeat_until_stopped() -> None:
    calls = 0
    third = asyncio.Event()

    def step() -> None:
        nonlocal calls
        calls += 1
        if calls == 3:
            third.set()

    periodic = Periodic("test", step, 0.001)
    task = periodic.start()
    assert periodic.start() is task  # started once
    await asyncio.wait_for(third.wait(), 5)
    await periodic.stop()
    assert task.cancelled() and periodic.task is None
    seen = calls
    await asyncio.sleep(0)
    assert calls == seen  # no step after stop


async def test_an_async_step_is_awaited_before_the_next() -> None:
    running = 0
    overlapped = False
    done = asyncio.Event()
    count = 0

    async def step() -> None:
        nonlocal running, overlapped, count
        running += 1
        overlapped |= running > 1
        await asyncio.sleep(0)
        running -= 1
        count += 1
        if count == 5:
            done.set()

    periodic = Periodic("test", step, 0)
    periodic.start()
    await asyncio.wait_for(done.wait(), 5)
    await periodic.stop()
    assert not overlapped


async def test_the_first_step_can_wait_one_interval() -> None:
    called = asyncio.Event()
    periodic = Periodic("test", called.set, 3600, wait_first=True)
    periodic.start()
    for _ in range(20):
        await asyncio.sleep(0)
    assert not called.is_set()
    await periodic.stop()

    at_once = Periodic("test", called.set, 3600)
    at_once.start()
    await asyncio.wait_for(called.wait(), 5)
    await at_once.stop()


async def test_an_error_ends_the_task_unless_handed_to_on_error() -> None:
    def broken() -> None:
        raise RuntimeError("bug")

    ending = Periodic("test", broken, 0)
    with pytest.raises(RuntimeError, match="bug"):
        await asyncio.wait_for(ending.start(), 5)

    errors: list[Exception] = []
    twice = asyncio.Event()

    def handle(e: Exception) -> None:
        errors.append(e)
        if len(errors) == 2:
            twice.set()

    going_on = Periodic("test", broken, 0, on_error=handle)
    going_on.start()
    await asyncio.wait_for(twice.wait(), 5)
    await going_on.stop()
    assert all(isinstance(e, RuntimeError) for e in errors)


async def test_stop_before_start_and_twice_is_harmless() -> None:
    periodic = Periodic("test", lambda: None, 1)
    await periodic.stop()
    periodic.start()
    await periodic.stop()
    await periodic.stop()
