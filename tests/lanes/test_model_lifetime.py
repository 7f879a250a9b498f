"""A model's lifetime is not anyone's (issue #36, class 4): changing it (Ollama's
``keep_alive``: 0 unloads, < 0 pins) needs the right to load the model, a policy bounds how
long a request may keep one (``models.max_keep_alive``), and a load that cannot fit beside
the pinned models is answered at once instead of after ``load_timeout``. Lane workers are
tests/fakes/fake_worker.py processes."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import aiohttp
import openai
import pytest

from router.lanes import group
from router.lanes.residency import Resident, make_room
from tests.conftest import RunningRouter, run_router
from tests.lanes.test_models import (
    ONE_MODEL,
    chat,
    entry,
    fake_command,
    settings_for,
    write_policies,
)

VIEWER = '[models]\nload = []\n[match]\nclient_header = ["viewer"]\n'
BOUNDED = '[models]\nmax_keep_alive = 60\n[match]\nclient_header = ["bounded"]\n'


@pytest.fixture(autouse=True)
def fake_workers(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    monkeypatch.setattr(group, "build_worker_command", fake_command)
    yield


async def post(router: RunningRouter, path: str, body: dict[str, Any], client: str) -> Any:
    headers = {"X-Speclane-Client": client}
    async with (
        aiohttp.ClientSession() as s,
        s.post(router.url + path, json=body, headers=headers) as r,
    ):
        return r.status, await r.json()


async def test_a_client_that_may_not_load_a_model_cannot_unload_or_pin_it(
    tmp_path: Path,
) -> None:
    policies = write_policies(tmp_path, "", viewer=VIEWER)
    async with run_router(settings_for(tmp_path, policies=policies, ttl=300)) as router:
        await chat(router, "beta")  # loaded by the default client
        before = entry(router, "beta")["expires_in"]
        chat_body = {"model": "beta", "messages": [{"role": "user", "content": "hi"}]}
        attempts = [
            ("/api/generate", {"model": "beta", "keep_alive": 0}),  # an unload request
            ("/api/generate", {"model": "beta", "keep_alive": -1}),  # a load request, pinned
            ("/api/chat", {**chat_body, "stream": False, "keep_alive": 0}),
            ("/api/chat", {**chat_body, "stream": False, "keep_alive": -1}),
            ("/api/generate", {"model": "beta", "prompt": "hi", "keep_alive": "24h"}),
        ]
        for path, body in attempts:
            status, answer = await post(router, path, body, "viewer")
            assert status == 403, (path, body, answer)
            assert "[keep_alive_forbidden]" in answer["error"]  # Ollama's shape
        await asyncio.sleep(0.3)  # an unload would have begun by now
        beta = entry(router, "beta")
        assert beta["state"] == "loaded"
        assert beta["expires_in"] is not None and beta["expires_in"] <= before
        # without keep_alive the viewer uses the loaded model as before
        status, answer = await post(router, "/api/chat", {**chat_body, "stream": False}, "viewer")
        assert status == 200 and answer["message"]["content"] == "ok"
        # the client that may load it still can change its lifetime
        status, _ = await post(router, "/api/generate", {"model": "beta", "keep_alive": -1}, "x")
        assert status == 200 and entry(router, "beta")["expires_in"] is None


async def test_a_policy_bounds_how_long_a_request_keeps_a_model(tmp_path: Path) -> None:
    policies = write_policies(tmp_path, "", bounded=BOUNDED)
    async with run_router(settings_for(tmp_path, policies=policies, ttl=300)) as router:
        for keep_alive in (-1, "2h", 3600):
            status, _ = await post(
                router, "/api/generate", {"model": "beta", "keep_alive": keep_alive}, "bounded"
            )
            assert status == 200
            assert 0 < entry(router, "beta")["expires_in"] <= 60
        status, _ = await post(
            router, "/api/generate", {"model": "beta", "keep_alive": 5}, "bounded"
        )
        assert status == 200 and entry(router, "beta")["expires_in"] <= 5


def test_a_model_that_cannot_fit_beside_the_pinned_ones_is_hopeless() -> None:
    pinned = Resident("pinned", 6, 1.0, pinned=True)
    busy = Resident("busy", 3, 1.0, in_flight=1)
    assert make_room(5, 10, [pinned, busy]).blocked_by_pinned
    assert make_room(5, 10, [pinned, busy]).holders == ("pinned",)
    waits = make_room(4, 10, [pinned, busy])  # fits once busy is idle: worth waiting
    assert not waits.fits and not waits.blocked_by_pinned


async def test_a_load_blocked_by_pinned_models_is_answered_at_once(tmp_path: Path) -> None:
    # alpha (the start-up model, pinned) leaves no room for another model: no wait helps
    settings = settings_for(tmp_path, memory_limit_bytes=ONE_MODEL + 10, load_timeout=600)
    async with run_router(settings) as router:
        with pytest.raises(openai.APIStatusError) as caught:
            await asyncio.wait_for(chat(router, "beta"), 30)  # not after load_timeout
        body: Any = caught.value.body
        assert (caught.value.status_code, body["code"]) == (503, "model_memory_busy")
        assert "alpha" in body["message"] and "pinned" in body["message"]
        assert entry(router, "beta")["state"] == "unloaded"
        assert (await chat(router, "alpha")).choices[0].message.content == "ok"
