"""Models on demand through the router (router.lanes.models, router.proxy.ondemand), with the
lane workers played by tests/fakes/fake_worker.py processes: the rules of loading, sharing a
load, TTL, eviction by memory, failures and policies, without MLX. The same with the real
model: tests/lanes/test_models_e2e.py."""

from __future__ import annotations

import asyncio
import dataclasses
import os
import re
import sys
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import aiohttp
import openai
import psutil
import pytest

from router.kernel.worker_contract import WORKER_SECRET_ENV, new_worker_secret
from router.lanes import group
from router.lanes.layout import PROCESS_BYTES
from router.lanes.models import ModelManager
from router.lanes.process import WorkerCommand
from tests.conftest import RunningRouter, metric_value, router_settings, run_router, wait_until

FAKE_WORKER = Path(__file__).parents[1] / "fakes" / "fake_worker.py"
WEIGHTS = 1000  # bytes of each fake model's weights file
ONE_MODEL = WEIGHTS + PROCESS_BYTES  # its estimate: one process (batching off), no cache


def fake_command(
    lane: str, settings: Any, model_dir: Path, draft: Path | None, model_name: str, **_: Any
) -> WorkerCommand:
    flags = ["--mode", lane, "--port", "0", "--model", str(model_dir), "--model-name", model_name]
    if "broken" in model_dir.name:
        flags += ["--exit-early", "7"]
    argv = (sys.executable, str(FAKE_WORKER), *flags)
    secret = new_worker_secret()  # as the real command: the fake answers only with it
    env = {**os.environ, "PYTHONUNBUFFERED": "1", WORKER_SECRET_ENV: secret}
    return WorkerCommand(lane=lane, argv=argv, env=env, secret=secret)


@pytest.fixture(autouse=True)
def fake_workers(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    monkeypatch.setattr(group, "build_worker_command", fake_command)
    yield


def model_dir(root: Path, name: str) -> Path:
    path = root / name
    path.mkdir()
    (path / "config.json").write_text("{}")
    (path / "model.safetensors").write_bytes(b"\0" * WEIGHTS)
    return path


def write_policies(root: Path, default: str = "", **others: str) -> Path:
    policies = root / "policies"
    policies.mkdir()
    (policies / "default.toml").write_text('client = "default"\n' + default)
    for name, text in others.items():
        (policies / f"{name}.toml").write_text(f'client = "{name}"\n{text}')
    return policies


def settings_for(tmp: Path, *, policies: Path | None = None, **lanes: Any) -> Any:
    models = tmp / "models"
    models.mkdir(exist_ok=True)
    for name in ("alpha", "beta", "gamma", "broken"):
        model_dir(models, name)
    lanes_config = {
        "enabled": True,
        "model": str(models / "alpha"),
        "models_dir": str(models),
        "batching": {"enabled": False},  # one fake worker per model
        "prompt_cache_bytes": 0,
        "machine_memory_bytes": 64 << 30,
        "health_interval": 0.2,
        "startup_timeout": 20,
        "load_timeout": 20,
        **lanes,
    }
    extra = {"policies_dir": str(policies)} if policies is not None else {}
    return router_settings(backends=[], lanes=lanes_config, **extra)


async def chat(router: RunningRouter, model: str, **headers: str) -> Any:
    client = router.client(default_headers=headers) if headers else router.client()
    return await client.chat.completions.create(
        model=model, messages=[{"role": "user", "content": "hi"}], max_tokens=5
    )


async def get_json(router: RunningRouter, path: str) -> Any:
    async with aiohttp.ClientSession() as s, s.get(router.url + path) as r:
        assert r.status == 200, await r.text()
        return await r.json()


def manager(router: RunningRouter) -> ModelManager:
    found = router.services.started.models
    assert found is not None
    return found


def entry(router: RunningRouter, name: str) -> dict[str, Any]:
    return next(m for m in manager(router).models() if m["name"] == name)


def metric(router: RunningRouter, name: str, **labels: str) -> float | None:

    return metric_value(router.services.metrics.render().decode(), name, **labels)


def worker_pids(router: RunningRouter, name: str) -> list[int]:
    pids: list[int] = entry(router, name)["pids"]
    return pids


def gone(pid: int) -> bool:
    try:
        proc = psutil.Process(pid)
        return not proc.is_running() or proc.status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


@pytest.fixture
async def router(tmp_path: Path) -> AsyncIterator[RunningRouter]:
    async with run_router(settings_for(tmp_path)) as r:
        yield r


async def test_listing_shows_every_servable_model_with_state_and_size(
    router: RunningRouter,
) -> None:
    listed = {m["id"]: m for m in (await get_json(router, "/v1/models"))["data"]}
    assert sorted(listed) == ["alpha", "beta", "broken", "gamma"]
    assert listed["alpha"]["speclane"] == {"state": "loaded", "size_bytes": WEIGHTS}
    assert listed["beta"]["speclane"] == {"state": "unloaded", "size_bytes": WEIGHTS}
    tags = {m["name"]: m for m in (await get_json(router, "/api/tags"))["models"]}
    assert sorted(tags) == ["alpha", "beta", "broken", "gamma"]
    assert tags["beta"]["size"] == WEIGHTS
    ps = [m["name"] for m in (await get_json(router, "/api/ps"))["models"]]
    assert ps == ["alpha"]


async def test_a_request_for_an_unloaded_model_loads_it_and_is_answered(
    router: RunningRouter,
) -> None:
    raw = await router.client().chat.completions.with_raw_response.create(
        model="beta", messages=[{"role": "user", "content": "hi"}], max_tokens=5
    )
    assert float(raw.headers["X-Speclane-Load-Ms"]) > 0  # the wait for beta, said
    assert float(raw.headers["X-Speclane-Overhead-Ms"]) < float(raw.headers["X-Speclane-Load-Ms"])
    answer = raw.parse()
    again = await router.client().chat.completions.with_raw_response.create(
        model="beta", messages=[{"role": "user", "content": "hi"}], max_tokens=5
    )
    assert "X-Speclane-Load-Ms" not in again.headers  # loaded: no wait
    assert answer.choices[0].message.content == "ok"
    assert answer.model == "beta"
    beta = entry(router, "beta")
    assert beta["state"] == "loaded"
    assert beta["lanes"] == ["speculative@beta"]
    assert beta["estimate_bytes"] == ONE_MODEL
    assert beta["in_flight"] == 0 and beta["pinned"] is False and beta["layout"] == "separate"
    assert entry(router, "alpha")["pinned"] is True  # the start-up model
    admin = await get_json(router, "/admin/lanes")
    assert {m["name"] for m in admin["models"]} == {"alpha", "beta", "broken", "gamma"}
    backends = {b["name"]: b for b in admin["backends"]}
    assert backends["speculative@beta"]["lane"] == "speculative"
    assert backends["speculative@beta"]["state"] == "ready"
    assert backends["speculative"]["model"] == "alpha"
    assert {w["pid"] for w in admin["workers"]} == {
        *entry(router, "alpha")["pids"],
        *entry(router, "beta")["pids"],
    }
    status = await get_json(router, "/admin/status")  # what the status page reads
    assert [m["name"] for m in status["models"]] == [m["name"] for m in admin["models"]]
    assert {b["name"]: b["state"] for b in status["backends"]}["speculative@beta"] == "ready"
    assert metric(router, "speclane_model_state", model="beta", state="loaded") == 1
    assert metric(router, "speclane_model_state", model="gamma", state="unloaded") == 1
    ps = [m["name"] for m in (await get_json(router, "/api/ps"))["models"]]
    assert ps == ["alpha", "beta"]


async def test_a_lanes_backend_follows_every_health_answer_of_its_worker(
    router: RunningRouter,
) -> None:
    """``Backend.reported`` (``/admin/lanes``' worker block, the queue the router routes by)
    is the worker's latest /health, not the one of its ready time."""
    backend = next(b for b in router.services.pool if b.name == "speculative")
    first = int(backend.reported["progress_tokens"])  # the fake counts its /health answers
    await wait_until(lambda: int(backend.reported["progress_tokens"]) > first + 1, 20)
    admin = await get_json(router, "/admin/lanes")
    row = next(b for b in admin["backends"] if b["name"] == "speculative")
    assert row["state"] == "ready" and row["worker"]["pid"] == backend.reported["pid"]


async def test_concurrent_first_requests_share_one_load(router: RunningRouter) -> None:
    answers = await asyncio.gather(*(chat(router, "gamma") for _ in range(4)))
    assert all(a.choices[0].message.content == "ok" for a in answers)
    assert metric(router, "speclane_model_loads_total", model="gamma", outcome="loaded") == 1
    assert len(worker_pids(router, "gamma")) == 1


async def test_a_broken_model_answers_a_clear_error_and_the_others_keep_serving(
    router: RunningRouter, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    with pytest.raises(openai.APIStatusError) as caught:
        await chat(router, "broken")
    assert caught.value.status_code == 503
    body: Any = caught.value.body
    assert body["code"] == "model_load_failed"
    message = body["message"]
    assert "model 'broken' could not be loaded" in message
    # the client gets an id; the worker's stderr and the server's paths stay in the log
    found = re.search(r"error id (load_[0-9a-f]{12})", message)
    assert found is not None, message
    assert str(tmp_path) not in message and "exit" not in message and "fake" not in message
    detail = entry(router, "broken")["last_error"]
    assert found[1] in detail and "exit" in detail  # /admin/lanes: the worker's own reason
    assert any(found[1] in r.getMessage() and "exit" in r.getMessage() for r in caplog.records)
    assert entry(router, "broken")["state"] == "failed"
    assert (await chat(router, "alpha")).choices[0].message.content == "ok"
    assert (await chat(router, "beta")).choices[0].message.content == "ok"
    assert metric(router, "speclane_model_loads_total", model="broken", outcome="failed") == 1


async def test_a_short_ttl_unloads_an_idle_model_and_its_worker_exits(tmp_path: Path) -> None:
    async with run_router(settings_for(tmp_path, ttl=0.5)) as router:
        await chat(router, "beta")
        (pid,) = worker_pids(router, "beta")
        await wait_until(lambda: entry(router, "beta")["state"] == "unloaded", 10)
        await wait_until(lambda: gone(pid))  # the worker stops after leaving the pool
        assert metric(router, "speclane_model_unloads_total", model="beta", reason="ttl") == 1
        # its worker metrics are its own: the start-up model's lane stays up
        await wait_until(lambda: metric(router, "speclane_worker_up", lane="speculative@beta") == 0)
        assert metric(router, "speclane_worker_up", lane="speculative") == 1
        assert entry(router, "alpha")["state"] == "loaded"  # pinned: the start-up model
        # asked again, it loads again
        assert (await chat(router, "beta")).choices[0].message.content == "ok"


async def test_memory_for_one_more_model_evicts_the_idle_one(tmp_path: Path) -> None:
    limit = 2 * ONE_MODEL + 10  # alpha (pinned) and one more
    async with run_router(settings_for(tmp_path, memory_limit_bytes=limit)) as router:
        await chat(router, "beta")
        (pid,) = worker_pids(router, "beta")
        assert (await chat(router, "gamma")).choices[0].message.content == "ok"
        assert entry(router, "beta")["state"] == "unloaded"
        assert entry(router, "gamma")["state"] == "loaded"
        assert metric(router, "speclane_model_unloads_total", model="beta", reason="memory") == 1
        await wait_until(lambda: gone(pid))


async def test_a_model_with_a_request_in_flight_is_never_evicted(tmp_path: Path) -> None:
    limit = 2 * ONE_MODEL + 10
    settings = settings_for(tmp_path, memory_limit_bytes=limit, load_timeout=3)
    async with run_router(settings) as router:
        await chat(router, "beta")
        with manager(router).hold("beta"):  # what a stream still open on beta holds
            with pytest.raises(openai.APIStatusError) as caught:
                await chat(router, "gamma")
            assert caught.value.status_code == 503
            body: Any = caught.value.body
            assert body["code"] == "model_memory_busy"
            assert "beta (1 in flight)" in body["message"]
            assert "alpha" in body["message"] and "pinned" in body["message"]
            assert caught.value.response.headers["Retry-After"]
            assert entry(router, "beta")["state"] == "loaded"
        # beta idle again: now it gives way
        assert (await chat(router, "gamma")).choices[0].message.content == "ok"
        assert entry(router, "beta")["state"] == "unloaded"


async def test_a_load_waiting_for_memory_proceeds_when_the_model_in_flight_ends(
    tmp_path: Path,
) -> None:
    limit = 2 * ONE_MODEL + 10
    async with run_router(settings_for(tmp_path, memory_limit_bytes=limit)) as router:
        await chat(router, "beta")
        models = manager(router)
        hold = models.hold("beta")
        hold.__enter__()
        waiting = asyncio.create_task(chat(router, "gamma"))
        await wait_until(lambda: entry(router, "gamma")["state"] == "loading")
        assert not waiting.done()
        hold.__exit__(None, None, None)  # the stream on beta ended
        assert (await waiting).choices[0].message.content == "ok"
        assert entry(router, "beta")["state"] == "unloaded"


async def test_a_model_too_big_for_the_limit_fails_at_once(tmp_path: Path) -> None:
    huge = model_dir(tmp_path, "huge")
    (huge / "model.safetensors").write_bytes(b"\0" * (WEIGHTS + 4096))
    settings = settings_for(
        tmp_path,
        memory_limit_bytes=ONE_MODEL + 100,  # alpha fits; huge does not, even alone
        models=[{"name": "huge", "path": str(huge)}],
    )
    async with run_router(settings) as router:
        with pytest.raises(openai.APIStatusError) as caught:
            await chat(router, "huge")
        body: Any = caught.value.body
        assert (caught.value.status_code, body["code"]) == (503, "model_load_failed")
        assert "lanes.memory_limit_bytes" in body["message"]


async def test_a_policy_restricts_which_models_a_client_may_load(tmp_path: Path) -> None:
    policies = write_policies(
        tmp_path,
        "[models]\nload = []\n",
        loader='[match]\nclient_header = ["loader"]\n',
    )
    async with run_router(settings_for(tmp_path, policies=policies)) as router:
        with pytest.raises(openai.APIStatusError) as caught:
            await chat(router, "beta")
        body: Any = caught.value.body
        assert (caught.value.status_code, body["code"]) == (403, "model_load_forbidden")
        assert entry(router, "beta")["state"] == "unloaded"
        # another client may load it; once loaded, the first may use it
        await chat(router, "beta", **{"X-Speclane-Client": "loader"})
        assert (await chat(router, "beta")).choices[0].message.content == "ok"
    # a model the policy may not use at all stays a 403 model_not_allowed, and is not loaded
    second = tmp_path / "second"
    second.mkdir()
    policies = write_policies(second, '[models]\nallow = ["alpha"]\n')
    async with run_router(settings_for(second, policies=policies)) as router:
        with pytest.raises(openai.APIStatusError) as caught:
            await chat(router, "beta")
        assert (caught.value.status_code, caught.value.body["code"]) == (  # type: ignore[index]
            403,
            "model_not_allowed",
        )
        assert entry(router, "beta")["state"] == "unloaded"


async def test_a_catalog_alias_loads_its_model(tmp_path: Path) -> None:
    extra = model_dir(tmp_path, "delta-weights")
    models = [{"name": "delta", "path": str(extra), "aliases": ["fast"]}]
    async with run_router(settings_for(tmp_path, models=models)) as router:
        answer = await chat(router, "fast")
        assert answer.choices[0].message.content == "ok"
        assert entry(router, "delta")["state"] == "loaded"
        assert entry(router, "delta")["aliases"] == ["fast"]


async def test_ollama_keep_alive_zero_unloads_after_the_answer(router: RunningRouter) -> None:
    body = {
        "model": "beta",
        "messages": [{"role": "user", "content": "hi"}],
        "stream": False,
        "keep_alive": 0,
    }
    async with (
        aiohttp.ClientSession() as s,
        s.post(router.url + "/api/chat", json=body) as r,
    ):
        assert r.status == 200, await r.text()
        answer = await r.json()
    assert answer["message"]["content"] == "ok"
    assert answer["load_duration"] > 0  # this request waited for beta to load
    await wait_until(lambda: entry(router, "beta")["state"] == "unloaded")
    assert metric(router, "speclane_model_unloads_total", model="beta", reason="keep_alive") == 1
    # a keep_alive on a loaded model's request: the deadline shows in /api/ps
    body["keep_alive"] = "1h"
    async with aiohttp.ClientSession() as s, s.post(router.url + "/api/chat", json=body) as r:
        assert r.status == 200
    assert 3500 < entry(router, "beta")["expires_in"] <= 3600


async def test_ollama_load_and_unload_requests(router: RunningRouter) -> None:
    async with aiohttp.ClientSession() as s:
        async with s.post(router.url + "/api/generate", json={"model": "gamma"}) as r:
            assert r.status == 200, await r.text()
            assert (await r.json())["done_reason"] == "load"
        assert entry(router, "gamma")["state"] == "loaded"
        unload = {"model": "gamma", "keep_alive": 0}
        async with s.post(router.url + "/api/generate", json=unload) as r:
            assert (await r.json())["done_reason"] == "unload"
        await wait_until(lambda: entry(router, "gamma")["state"] == "unloaded")
        async with s.post(router.url + "/api/generate", json={"model": "nope"}) as r:
            assert r.status == 404


async def test_count_tokens_loads_its_model(router: RunningRouter) -> None:
    body = {"model": "beta", "messages": [{"role": "user", "content": "hi"}]}
    async with (
        aiohttp.ClientSession() as s,
        s.post(router.url + "/v1/messages/count_tokens", json=body) as r,
    ):
        await r.read()  # the fake worker cannot count: only the load is checked here
    assert entry(router, "beta")["state"] == "loaded"
    assert entry(router, "beta")["in_flight"] == 0


async def test_embeddings_never_load_a_model(router: RunningRouter) -> None:
    with pytest.raises(openai.NotFoundError):  # the lanes do not embed
        await router.client().embeddings.create(model="beta", input="hi")
    assert entry(router, "beta")["state"] == "unloaded"


def gated_command(
    lane: str, settings: Any, model_dir: Path, draft: Path | None, model_name: str, **kw: Any
) -> WorkerCommand:
    """beta's fake workers become ready only once its model folder holds ``go``."""
    command = fake_command(lane, settings, model_dir, draft, model_name, **kw)
    if model_dir.name != "beta":
        return command
    return dataclasses.replace(command, argv=(*command.argv, "--start-when", str(model_dir / "go")))


async def test_past_the_load_queue_a_request_gets_503_at_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # beta's load is held open until the test lets it go: its request is sure to hold the
    # one place while gamma's arrives (it could finish first on a loaded machine).
    monkeypatch.setattr(group, "build_worker_command", gated_command)
    async with run_router(settings_for(tmp_path, load_queue=1)) as router:
        first = asyncio.create_task(chat(router, "beta"))
        await wait_until(lambda: entry(router, "beta")["state"] == "loading")  # in the queue
        assert entry(router, "beta")["in_flight"] == 1
        with pytest.raises(openai.APIStatusError) as caught:
            await chat(router, "gamma")
        body: Any = caught.value.body
        assert (caught.value.status_code, body["code"]) == (503, "model_load_queue_full")
        (tmp_path / "models" / "beta" / "go").write_text("")
        assert (await first).choices[0].message.content == "ok"
        assert entry(router, "gamma")["state"] == "unloaded"


async def test_a_model_folder_added_while_running_is_servable(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from router.lanes import models as models_module

    monkeypatch.setattr(models_module, "RESCAN_INTERVAL", 0.0)
    async with run_router(settings_for(tmp_path)) as router:
        with pytest.raises(openai.NotFoundError):
            await chat(router, "delta")
        model_dir(tmp_path / "models", "delta")
        assert (await chat(router, "delta")).choices[0].message.content == "ok"
        listed = [m["id"] for m in (await get_json(router, "/v1/models"))["data"]]
        assert "delta" in listed
        assert entry(router, "delta")["state"] == "loaded"


def die_once_command(
    lane: str, settings: Any, model_dir: Path, draft: Path | None, model_name: str, **kw: Any
) -> WorkerCommand:
    command = fake_command(lane, settings, model_dir, draft, model_name, **kw)
    marker = model_dir / "die-once"
    if marker.exists():
        marker.unlink()
        return dataclasses.replace(command, argv=(*command.argv, "--die-after", "0.3"))
    return command


async def test_a_model_whose_lanes_were_given_up_loads_again_when_asked(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(group, "build_worker_command", die_once_command)
    async with run_router(settings_for(tmp_path, max_restarts=0)) as router:
        (tmp_path / "models" / "beta" / "die-once").write_text("")
        await chat(router, "beta")  # answered before its worker dies
        await wait_until(
            lambda: (
                router.services.started.models is not None
                and not any(
                    s.status.state.value != "failed"
                    for s in manager(router)._slots["beta"].supervisors
                )
            ),
            10,
        )
        assert (await chat(router, "beta")).choices[0].message.content == "ok"
        assert metric(router, "speclane_model_unloads_total", model="beta", reason="failed") == 1
        assert entry(router, "beta")["state"] == "loaded"


def slow_batching_command(
    lane: str, settings: Any, model_dir: Path, draft: Path | None, model_name: str, **kw: Any
) -> WorkerCommand:
    command = fake_command(lane, settings, model_dir, draft, model_name, **kw)
    if lane == "batching" and model_dir.name == "gamma":
        return dataclasses.replace(command, argv=(*command.argv, "--slow-start", "60"))
    return command


async def test_a_model_loaded_on_demand_serves_once_its_first_lane_is_ready(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(group, "build_worker_command", slow_batching_command)
    both = settings_for(tmp_path, batching={"enabled": True}, layout="separate")
    async with run_router(both) as router:
        answer = await asyncio.wait_for(chat(router, "gamma"), 30)  # not the batching lane's 60 s
        assert answer.choices[0].message.content == "ok"
        backends = {b.name: b for b in manager(router)._slots["gamma"].backends}
        assert backends["speculative@gamma"].ready and not backends["batching@gamma"].ready
        assert entry(router, "gamma")["state"] == "loaded"
