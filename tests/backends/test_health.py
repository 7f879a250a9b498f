"""Health checks of external backends, as start-up and routing see them."""

from __future__ import annotations

import asyncio

import aiohttp
import pytest

import router.app
from router.appkeys import POOL
from tests.conftest import fake_upstreams, router_settings, run_router, wait_until

CHAT = [{"role": "user", "content": "hi"}]


async def test_a_backend_that_never_answers_its_health_check_does_not_hold_up_start(
        monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    monkeypatch.setattr(router.app, "STARTUP_HEALTH_WAIT", 0.3)
    async with fake_upstreams("hung", "up") as (hung, up):
        hung.models_gate = asyncio.Event()
        hung.models = ("hung-model",)
        # Its probe would give up only after connect_timeout + 5 s = 7 s.
        async with run_router(router_settings(hung, up)) as r:
            assert hung.models_asked.is_set() and not hung.models_gate.is_set()
            pool = r.app[POOL]
            assert pool["up"].ready and not pool["hung"].ready
            assert "first health check of hung" in caplog.text
            answer = await r.client().chat.completions.create(model="fake-model",
                                                              messages=CHAT)
            assert answer.choices[0].message.content
            async with aiohttp.ClientSession() as s, s.get(f"{r.url}/v1/models") as resp:
                assert [m["id"] for m in (await resp.json())["data"]] == ["fake-model"]
            # Its answer, when it comes, makes it ready without another round.
            hung.models_gate.set()
            await wait_until(lambda: pool["hung"].ready)
            again = await r.client().chat.completions.create(model="hung-model",
                                                             messages=CHAT)
            assert again.choices[0].message.content


async def test_start_waits_for_backends_that_answer(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(router.app, "STARTUP_HEALTH_WAIT", 30.0)
    async with fake_upstreams("a", "b") as (a, b):
        async with run_router(router_settings(a, b)) as r:
            # Ready from the first request: start waited for the first round.
            assert r.app[POOL]["a"].ready and r.app[POOL]["b"].ready
