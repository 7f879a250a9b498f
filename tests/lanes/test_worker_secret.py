"""Only the router reaches a lane worker (issue #36, class 2): the supervisor draws a secret per
worker, hands it over in the environment (never the command line), and every request the
router sends a worker (relay, health polls, token counts, progress looks) carries it; a
program that found the worker's port gets a 401. Lane workers are
tests/fakes/fake_worker.py processes that check the secret as the real worker does
(tests/worker/http/test_server.py tests the real worker's check;
tests/lanes/test_worker_secret_e2e.py the two together)."""

from __future__ import annotations

import os
import sys
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import aiohttp
import psutil
import pytest

from router.backends.base import SPECLANE_KIND, Backend
from router.backends.cooldown import Cooldown
from router.config.settings import LanesSettings
from router.kernel.worker_contract import WORKER_SECRET_ENV, WORKER_SECRET_HEADER
from router.lanes import group
from router.lanes.process import WorkerCommand, build_worker_command
from router.lanes.supervisor import LaneSupervisor
from tests.conftest import RunningRouter, run_router, wait_until
from tests.lanes.test_models import chat, fake_command, get_json, manager, settings_for

FAKE_WORKER = Path(__file__).parents[1] / "fakes" / "fake_worker.py"


@pytest.fixture(autouse=True)
def fake_workers(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    monkeypatch.setattr(group, "build_worker_command", fake_command)
    yield


@pytest.fixture
async def router(tmp_path: Path) -> AsyncIterator[RunningRouter]:
    async with run_router(settings_for(tmp_path)) as r:
        yield r


def test_the_secret_is_in_the_workers_environment_never_on_its_command_line(
    tmp_path: Path,
) -> None:
    command = build_worker_command("batching", LanesSettings(), tmp_path, None, "m")
    assert command.secret and len(command.secret) >= 32
    assert command.env[WORKER_SECRET_ENV] == command.secret
    assert not any(command.secret in arg for arg in command.argv)
    assert command.secret not in repr(command)
    assert command.auth_headers() == {WORKER_SECRET_HEADER: command.secret}
    other = build_worker_command("batching", LanesSettings(), tmp_path, None, "m")
    assert other.secret != command.secret  # drawn per worker, per run
    backend = Backend(
        "b", SPECLANE_KIND, "http://127.0.0.1:1/v1", Cooldown(1, 1), worker_secret="s3cr3t"
    )
    assert "s3cr3t" not in repr(backend)
    assert backend.auth_headers() == {WORKER_SECRET_HEADER: "s3cr3t"}


async def test_the_supervisor_polls_health_with_the_secret_and_strangers_get_401() -> None:
    secret = "fixed-secret-for-this-test-0123456789"
    argv = (sys.executable, str(FAKE_WORKER), "--mode", "batching", "--port", "0")
    env = {**os.environ, "PYTHONUNBUFFERED": "1", WORKER_SECRET_ENV: secret}
    command = WorkerCommand("batching", argv, env, secret=secret)
    sup = LaneSupervisor(command, startup_timeout=20, health_interval=0.1)
    try:
        await sup.start()  # READY only once /health answered: the poll carried the secret
        base = sup.status.base_url
        assert base is not None
        root = base.removesuffix("/v1")
        async with aiohttp.ClientSession() as s:
            for method, path in (("GET", "/health"), ("GET", "/v1/models"), ("POST", "/v1/x")):
                async with s.request(method, root + path) as r:
                    assert r.status == 401, path
            wrong = {WORKER_SECRET_HEADER: secret[:-1] + "X"}
            async with s.get(root + "/health", headers=wrong) as r:
                assert r.status == 401
            async with s.get(root + "/health", headers=command.auth_headers()) as r:
                assert r.status == 200
                assert (await r.json())["refused"] == 4
        worker = psutil.Process(sup.status.pid)
        assert not any(secret in arg for arg in worker.cmdline())
    finally:
        await sup.stop(2.0)


async def test_the_router_reaches_its_worker_a_stranger_with_its_address_does_not(
    router: RunningRouter,
) -> None:
    answer = await chat(router, "alpha")
    assert answer.choices[0].message.content == "ok"
    (backend,) = [b for b in manager(router).pool if b.name == "speculative"]
    secret = backend.worker_secret
    assert secret
    admin = await get_json(router, "/admin/lanes")
    url = {b["name"]: b["url"] for b in admin["backends"]}["speculative"]
    shown = [
        str(admin),
        str(await get_json(router, "/admin/status")),
        router.services.metrics.render().decode(),
    ]
    assert not any(secret in text for text in shown)
    chat_body = {"model": "alpha", "messages": [{"role": "user", "content": "hi"}]}
    hostile = {"Host": "evil.example", "Sec-Fetch-Site": "cross-site"}
    async with aiohttp.ClientSession() as s:
        async with s.post(f"{url}/chat/completions", json=chat_body, headers=hostile) as r:
            assert r.status == 401
        async with s.get(url.removesuffix("/v1") + "/health") as r:
            assert r.status == 401
        health_headers = {WORKER_SECRET_HEADER: secret}
        async with s.get(url.removesuffix("/v1") + "/health", headers=health_headers) as r:
            refused = (await r.json())["refused"]
    assert refused == 2  # the stranger's two requests; none of the router's


async def test_a_worker_restarted_by_its_supervisor_keeps_answering_the_router(
    router: RunningRouter,
) -> None:
    """The secret belongs to the command: a restarted worker gets the same one, so the
    backend's requests still carry the right secret."""
    (sup,) = [s for s in manager(router).supervisors() if "speculative" in s.lanes]
    pid = sup.status.pid
    assert pid is not None
    psutil.Process(pid).kill()
    (backend,) = [b for b in manager(router).pool if b.name == "speculative"]
    await wait_until(lambda: sup.status.pid not in (None, pid) and backend.ready, 20)
    assert (await chat(router, "alpha")).choices[0].message.content == "ok"
    assert sup.command.secret == backend.worker_secret
