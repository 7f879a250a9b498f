"""The lane-side ``still_working()`` hook: pure decision, then against a loopback /health."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import pytest
from aiohttp import web

from router.lanes.progress import (
    for_lane,
    progress_moved,
    progress_of,
    still_working_callback,
)


@pytest.mark.parametrize(
    ("last", "current", "busy", "moved"),
    [
        (None, None, True, False),  # no counter: not known to work
        (None, 10, True, True),  # first look at a busy lane: the benefit of the doubt once
        (None, 10, False, False),  # an idle lane is not working on anything
        (10, 10, True, False),  # busy but the counter stood still: hung
        (10, 11, True, True),
        (10, 11, False, True),  # it moved (and finished meanwhile)
        (10, 3, True, False),  # went down: a restarted worker, not this request's
        (10, None, True, False),
    ],
)
def test_progress_moved(last: int | None, current: int | None, busy: bool, moved: bool) -> None:
    assert progress_moved(last, current, busy) is moved


@pytest.mark.parametrize(
    ("health", "value"),
    [({"progress_tokens": 5}, 5), ({"progress_tokens": True}, None),
     ({"progress_tokens": -1}, None), ({"progress_tokens": "5"}, None), ({}, None), (None, None)],
)
def test_progress_of_reads_only_a_sane_counter(health: Any, value: int | None) -> None:
    assert progress_of(health) == value


@pytest.fixture
async def lane() -> AsyncIterator[tuple[str, dict[str, Any]]]:
    state: dict[str, Any] = {"status": "ok", "active": 1, "queued": 0, "progress_tokens": 100}

    async def health(request: web.Request) -> web.Response:
        if state.get("fail"):
            return web.Response(status=500)
        return web.json_response(state)

    app = web.Application()
    app.router.add_get("/health", health)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = runner.addresses[0][1]
    yield f"http://127.0.0.1:{port}", state
    await runner.cleanup()


async def test_the_callback_says_working_while_the_counter_moves(
    lane: tuple[str, dict[str, Any]],
) -> None:
    url, state = lane
    still_working = still_working_callback(url, baseline=100)
    assert not await still_working()  # no progress since the request was sent
    state["progress_tokens"] = 164  # a prefill chunk went through
    assert await still_working()
    assert not await still_working()  # nothing since the last look
    state["progress_tokens"] = 200
    assert await still_working()
    state["fail"] = True
    assert not await still_working()  # a lane that cannot answer is not known to work


async def test_without_a_baseline_the_first_look_trusts_a_busy_lane_once(
    lane: tuple[str, dict[str, Any]],
) -> None:
    url, _ = lane
    still_working = still_working_callback(url)
    assert await still_working()
    assert not await still_working()


async def test_an_unreachable_lane_is_not_working() -> None:
    assert not await still_working_callback("http://127.0.0.1:9", baseline=0, timeout=2)()


async def test_for_lane_takes_the_supervisor_snapshot_as_baseline(
    lane: tuple[str, dict[str, Any]],
) -> None:
    url, _ = lane
    assert await for_lane(f"{url}/v1", {"progress_tokens": 90})()  # moved since the snapshot
    assert not await for_lane(f"{url}/v1", {"progress_tokens": 100})()
