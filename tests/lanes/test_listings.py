"""Listings show what the caller may use (issue #36, class 6): ``/v1/models`` and the Ollama
door's ``/api/tags``, ``/api/ps``, ``/api/show`` leave out models the caller's policy neither
lets it use nor load. Lane workers are tests/fakes/fake_worker.py processes."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from router.lanes import group
from tests.conftest import RunningRouter, run_router
from tests.lanes.test_models import chat, fake_command, settings_for, write_policies

NARROW = '[models]\nallow = ["alpha", "gamma"]\nload = []\n[match]\nclient_header = ["narrow"]\n'
NARROW_HEADERS = {"X-Speclane-Client": "narrow"}


@pytest.fixture(autouse=True)
def fake_workers(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    monkeypatch.setattr(group, "build_worker_command", fake_command)
    yield


async def get(router: RunningRouter, path: str, headers: dict[str, str]) -> Any:
    async with aiohttp.ClientSession() as s, s.get(router.url + path, headers=headers) as r:
        assert r.status == 200
        return await r.json()


async def names(router: RunningRouter, headers: dict[str, str]) -> dict[str, list[str]]:
    return {
        "openai": [m["id"] for m in (await get(router, "/v1/models", headers))["data"]],
        "tags": [m["name"] for m in (await get(router, "/api/tags", headers))["models"]],
        "ps": [m["name"] for m in (await get(router, "/api/ps", headers))["models"]],
    }


async def test_a_client_sees_only_the_models_it_may_use_or_load(tmp_path: Path) -> None:
    policies = write_policies(tmp_path, "", narrow=NARROW)
    async with run_router(settings_for(tmp_path, policies=policies)) as router:
        everything = ["alpha", "beta", "broken", "gamma"]
        assert await names(router, {}) == {
            "openai": everything,
            "tags": everything,
            "ps": ["alpha"],
        }
        # gamma is allowed but not loaded, and narrow may not load it; beta is not allowed
        assert await names(router, NARROW_HEADERS) == {
            "openai": ["alpha"],
            "tags": ["alpha"],
            "ps": ["alpha"],
        }
        async with aiohttp.ClientSession() as s:
            async with s.post(
                router.url + "/api/show", json={"model": "beta"}, headers=NARROW_HEADERS
            ) as r:
                assert r.status == 404
        await chat(router, "gamma")  # the default client loads it: now narrow may use it
        listed = await names(router, NARROW_HEADERS)
        assert listed["openai"] == listed["tags"] == ["alpha", "gamma"]
