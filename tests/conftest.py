"""Shared fixtures: a real router on 127.0.0.1 port 0 in front of real fake upstreams."""

from __future__ import annotations

import tempfile
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any

import openai
import pytest
from aiohttp import web

from router.app import make_app
from router.config import Settings, load_settings
from tests.fakes.upstream import FakeUpstream


@dataclass
class RunningRouter:
    app: web.Application
    port: int

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def base_url(self) -> str:
        return f"{self.url}/v1"

    def client(self, **kwargs: Any) -> openai.AsyncOpenAI:
        kwargs.setdefault("api_key", "test-key")
        kwargs.setdefault("max_retries", 0)
        kwargs.setdefault("timeout", 30)
        return openai.AsyncOpenAI(base_url=self.base_url, **kwargs)


def router_settings(*fakes: FakeUpstream, **overrides: Any) -> Settings:
    backends = [
        {"name": f.name, "kind": "openai", "base_url": f.base_url, "read_timeout": 5,
         "connect_timeout": 2}
        for f in fakes
    ]
    data: dict[str, Any] = {
        "backends": backends,
        "lanes": {"enabled": False},
        "retry": {"attempts": 3, "backoff_initial": 0.001, "backoff_max": 0.01},
        "health_interval": 60,
        "shutdown_grace": 2,
        # an empty directory: the implied permissive default policy
        "policies_dir": tempfile.mkdtemp(prefix="speclane-policies-"),
    }
    return load_settings(None, **{**data, **overrides})


@asynccontextmanager
async def run_router(settings: Settings, **app_kwargs: Any) -> AsyncIterator[RunningRouter]:
    app = make_app(settings, **app_kwargs)
    runner = web.AppRunner(app, handler_cancellation=True, access_log=None,
                           shutdown_timeout=settings.shutdown_grace)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    try:
        yield RunningRouter(app, runner.addresses[0][1])
    finally:
        await runner.cleanup()


@asynccontextmanager
async def fake_upstreams(*names: str, **kwargs: Any) -> AsyncIterator[list[FakeUpstream]]:
    fakes = [FakeUpstream(name=n, **kwargs) for n in names]
    for f in fakes:
        await f.start()
    try:
        yield fakes
    finally:
        for f in fakes:
            await f.stop()


@pytest.fixture
async def fake() -> AsyncIterator[FakeUpstream]:
    async with fake_upstreams("fake") as (f,):
        yield f
