"""Shared fixtures: a real router on 127.0.0.1 port 0 in front of real fake upstreams."""

from __future__ import annotations

import asyncio
import tempfile
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any

import openai
import pytest
from aiohttp import web

from router.app import Wired, wire
from router.config.settings import Settings, load_settings
from router.proxy.services import Services
from tests.fakes.upstream import FakeUpstream

# The tiers (fast by default, realmodel, clients) and the guard that keeps the fast one fast;
# what the real-model tests share once per session (the models, a router with both lanes);
# the reliability suite's closing summary.
pytest_plugins = ["tests.tiers", "tests.realmodel", "tests.reliability.summary"]


@dataclass
class RunningRouter:
    app: web.Application
    services: Services  # what the app's handlers were handed (router.proxy.services)
    port: int
    # Clients handed out, closed when the router stops: an AsyncOpenAI left open is closed
    # by its finaliser whenever the GC finds it, often in a later test on another (closed)
    # event loop, where it logs "Event loop is closed" errors into that test's log capture.
    clients: list[openai.AsyncOpenAI] = field(default_factory=list)

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
        made = openai.AsyncOpenAI(base_url=self.base_url, **kwargs)
        self.clients.append(made)
        return made


def router_settings(*fakes: FakeUpstream, **overrides: Any) -> Settings:
    backends = [
        {
            "name": f.name,
            "kind": "openai",
            "base_url": f.base_url,
            "read_timeout": 5,
            "connect_timeout": 2,
        }
        for f in fakes
    ]
    data: dict[str, Any] = {
        "backends": backends,
        "lanes": {"enabled": False},
        "retry": {"attempts": 3, "backoff_initial": 0.001, "backoff_max": 0.01},
        # No keep-alives unless a test asks (tests/proxy/test_early.py): on a busy machine
        # a first chunk can take the 2 s default, and a test reading exact bytes or parts
        # would then read one.
        "client_limits": {"stream_keepalive": 60},
        "health_interval": 60,
        "shutdown_grace": 2,
        # an empty directory: the implied permissive default policy
        "policies_dir": tempfile.mkdtemp(prefix="speclane-policies-"),
    }
    return load_settings(None, **{**data, **overrides})


@asynccontextmanager
async def serve_app(app: web.Application, **runner_kwargs: Any) -> AsyncIterator[int]:
    """Serve ``app`` on 127.0.0.1, a free port (yielded), until the block ends."""
    runner = web.AppRunner(app, access_log=None, **runner_kwargs)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    try:
        yield runner.addresses[0][1]
    finally:
        await runner.cleanup()


@asynccontextmanager
async def run_router(
    settings: Settings, setup: Any = None, **app_kwargs: Any
) -> AsyncIterator[RunningRouter]:
    wired = wire(settings, **app_kwargs)
    app = wired.app
    if setup is not None:
        setup(wired)
    async with serve_app(
        app, handler_cancellation=True, shutdown_timeout=settings.shutdown_grace
    ) as port:
        running = RunningRouter(app, wired.services, port)
        try:
            yield running
        finally:
            for made in running.clients:
                await made.close()


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


def add_fake_lane(
    wired: Wired,
    lane: str,
    fake: FakeUpstream,
    *,
    speculative: bool = True,
    capacity: int | None = None,
) -> None:
    """Register a fake upstream as one of speclane's lanes (what the supervisor does for a
    real worker), so routing between lanes can be tested without MLX."""
    from router.lanes.group import lane_backend

    settings = wired.services.settings
    backend = lane_backend(lane, settings, fake.models[0])  # type: ignore[arg-type]
    backend.base_url = fake.base_url
    backend.ready = True
    backend.speculative_active = speculative and lane == "speculative"
    backend.has_draft = backend.speculative_active  # as a lane running its draft model says
    backend.reported = {"capacity": capacity or (1 if lane == "speculative" else 8)}
    wired.services.pool.add(backend)


@asynccontextmanager
async def lanes_router(
    spec_lane: FakeUpstream, batch_lane: FakeUpstream, **overrides: Any
) -> AsyncIterator[RunningRouter]:
    """A router whose two lanes are fake upstreams (and no external backends)."""
    settings = router_settings(**{"backends": [], **overrides})
    async with run_router(
        settings,
        setup=lambda wired: (
            add_fake_lane(wired, "speculative", spec_lane),
            add_fake_lane(wired, "batching", batch_lane),
        ),
    ) as r:
        yield r


async def wait_until(predicate: Any, deadline: float = 5.0) -> None:
    """Poll a cheap in-process condition (state we cannot await an event for)."""
    loop = asyncio.get_running_loop()
    end = loop.time() + deadline
    while not predicate():
        assert loop.time() < end, "condition not reached"
        await asyncio.sleep(0.01)


def metric_value(text: str, name: str, **labels: str) -> float | None:
    """The value of one sample in Prometheus text, matched by name and (a subset of) labels."""
    from prometheus_client.parser import text_string_to_metric_families

    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == name and all(sample.labels.get(k) == v for k, v in labels.items()):
                return float(sample.value)
    return None
