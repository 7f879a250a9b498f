"""The tokenizer threads: generation before counts, cancelled callers skipped, short work
never behind long work."""

from __future__ import annotations

import asyncio
import threading

from router.worker.http.tokenizing import COUNT, GENERATION, LONG_CHARS, TokenizerThread

WAIT = 10.0


async def test_a_generation_request_overtakes_every_queued_count() -> None:
    thread = TokenizerThread()
    gate, running = threading.Event(), threading.Event()
    order: list[str] = []

    def blocker() -> None:
        running.set()
        gate.wait(WAIT)

    def note(name: str) -> str:
        order.append(name)
        return name

    try:
        first = asyncio.ensure_future(thread.run(COUNT, blocker))
        assert await asyncio.to_thread(running.wait, WAIT)
        counts = [asyncio.ensure_future(thread.run(COUNT, note, f"count{i}")) for i in range(5)]
        await asyncio.sleep(0)  # the counts are queued before the generation request
        generation = asyncio.ensure_future(thread.run(GENERATION, note, "generation"))
        await asyncio.sleep(0)
        assert thread.waiting() == 6
        gate.set()
        assert await generation == "generation"
        await asyncio.gather(first, *counts)
    finally:
        gate.set()
        thread.shutdown()
    assert order == ["generation", *(f"count{i}" for i in range(5))]


async def test_a_cancelled_caller_leaves_and_errors_reach_theirs() -> None:
    thread = TokenizerThread()
    gate, running = threading.Event(), threading.Event()
    ran: list[str] = []

    def blocker() -> None:
        running.set()
        gate.wait(WAIT)

    def boom() -> None:
        raise ValueError("bad prompt")

    try:
        first = asyncio.ensure_future(thread.run(GENERATION, blocker))
        assert await asyncio.to_thread(running.wait, WAIT)
        left = asyncio.ensure_future(thread.run(COUNT, ran.append, "left"))
        await asyncio.sleep(0)
        left.cancel()
        await asyncio.gather(left, return_exceptions=True)  # the caller has gone
        gate.set()
        try:
            await thread.run(COUNT, boom)
        except ValueError as e:
            assert str(e) == "bad prompt"
        else:
            raise AssertionError("the error did not reach its caller")
        assert await thread.run(COUNT, len, "abc") == 3
        await first
    finally:
        gate.set()
        thread.shutdown()
    assert ran == []


async def test_a_long_prompt_never_holds_up_a_short_one() -> None:
    """Issue #44 class 3: a huge prompt's encode on the one thread made another client's
    1-token request wait 5.9-27 s; long work has a thread of its own."""
    thread = TokenizerThread()
    gate, running = threading.Event(), threading.Event()

    def long_encode() -> str:
        running.set()
        gate.wait(WAIT)
        return "long"

    try:
        long = asyncio.ensure_future(thread.run(GENERATION, long_encode, size=LONG_CHARS))
        assert await asyncio.to_thread(running.wait, WAIT)
        # Served while the long one still runs (the gate is still closed).
        assert await thread.run(GENERATION, len, "short", size=5) == 5
        assert await thread.run(COUNT, len, "ab") == 2
        assert not long.done()
        gate.set()
        assert await long == "long"
    finally:
        gate.set()
        thread.shutdown()
