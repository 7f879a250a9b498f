"""The lane-side ``still_working()`` hook: pure decision, then against a loopback /health."""

from __future__ import annotations

import asyncio
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
    [
        ({"progress_tokens": 5}, 5),
        ({"progress_tokens": True}, None),
        ({"progress_tokens": -1}, None),
        ({"progress_tokens": "5"}, None),
        ({}, None),
        (None, None),
    ],
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


# --- through the router: the relay asks a silent lane whether it still works -----------------


async def _prefilling_lane(moving: bool, answer_after: asyncio.Event) -> web.Application:
    """A lane worker that is silent on the request (a long prefill) while its /health
    counter moves (``moving``) or not; it answers once ``answer_after`` is set."""
    progress = {"n": 0}

    async def health(request: web.Request) -> web.Response:
        if moving:
            progress["n"] += 100
        return web.json_response(
            {"status": "ok", "progress_tokens": progress["n"], "active": 1, "queued": 0}
        )

    async def chat(request: web.Request) -> web.Response:
        await answer_after.wait()
        return web.json_response(
            {
                "id": "x",
                "object": "chat.completion",
                "created": 0,
                "model": "m",
                "choices": [
                    {
                        "index": 0,
                        "message": {"role": "assistant", "content": "ok"},
                        "finish_reason": "stop",
                    }
                ],
                "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2},
            }
        )

    app = web.Application()
    app.router.add_get("/health", health)
    app.router.add_post("/v1/chat/completions", chat)
    return app


@pytest.mark.parametrize("moving", [True, False])
async def test_a_silent_lane_whose_counter_moves_is_not_a_504(moving: bool) -> None:
    from router.lanes.group import lane_backend
    from tests.conftest import Wired, router_settings, run_router, serve_app

    release = asyncio.Event()
    asked = asyncio.Event()
    lane_app = await _prefilling_lane(moving, release)

    looks = 0

    @web.middleware
    async def count_health(request: web.Request, handler: Any) -> web.StreamResponse:
        nonlocal looks
        if request.path == "/health":
            asked.set()
            if moving and looks >= 2:
                release.set()  # silent through two deadlines, then the answer comes
            looks += 1
        return await handler(request)

    lane_app.middlewares.append(count_health)
    async with serve_app(lane_app) as port:
        settings = router_settings(backends=[], lanes={"enabled": False, "read_timeout": 0.3})

        def setup(wired: Wired) -> None:
            backend = lane_backend("batching", settings, "m")
            backend.base_url = f"http://127.0.0.1:{port}/v1"
            backend.ready = True
            wired.services.pool.add(backend)

        async with run_router(settings, setup=setup) as router:
            client = router.client()
            if moving:
                reply = await client.chat.completions.create(
                    model="m", messages=[{"role": "user", "content": "hi"}]
                )
                assert reply.choices[0].message.content == "ok"
            else:
                import openai

                with pytest.raises(openai.APIStatusError) as err:
                    await client.chat.completions.create(
                        model="m", messages=[{"role": "user", "content": "hi"}]
                    )
                assert err.value.status_code == 504
            assert asked.is_set()  # the relay asked the lane, it did not just time out
            release.set()
