"""The router with both lanes over a group of two real ranks on 127.0.0.1 (``[lanes.group]``,
``mlx.launch --backend ring``), on a tiny random llama: the supervisor treats the launcher
as the lanes' one (shared) worker. Chat, streams, a forced tool call and the Anthropic door
through the router, on either lane; ``/admin/lanes`` shows both lanes with the ranks, hosts
and memory per host; a killed rank brings the whole group down and back; SIGTERM leaves no
rank."""

from __future__ import annotations

import json
import signal
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psutil
import pytest

from router.lanes.modelprep import ensure_default_models
from tests.conftest import metric_value
from tests.lanes.test_lanes_e2e import Router, start_router, stop_router
from tests.lanes.test_lanes_tools_e2e import ASK, READ
from tests.worker.group.tiny import make_tiny_model

pytestmark = pytest.mark.realmodel

LANE = {"X-Speclane-Lane": "speculative"}


def group_config(model: Path) -> str:
    return (
        f'model = "{model}"\ndraft_source = "prompt_lookup"\n'
        '[lanes.group]\nhosts = ["127.0.0.1", "127.0.0.1"]\n'
    )


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    target, _ = ensure_default_models(quiet=True)
    return make_tiny_model(tmp_path_factory.mktemp("tiny") / "tiny", target)


@pytest.fixture(scope="module")
def router(tmp_path_factory: pytest.TempPathFactory, tiny_model: Path) -> Iterator[Router]:
    r = start_router(tmp_path_factory.mktemp("group"), group_config(tiny_model))
    yield r
    stop_router(r)


def admin_lanes(router: Router) -> dict[str, Any]:
    with urllib.request.urlopen(router.base_url.removesuffix("/v1") + "/admin/lanes") as resp:
        return json.loads(resp.read())


def launcher(router: Router) -> psutil.Process:
    (worker,) = admin_lanes(router)["workers"]
    return psutil.Process(worker["pid"])


def ranks(router: Router) -> list[psutil.Process]:
    return [p for p in launcher(router).children(recursive=True) if "router.worker" in p.cmdline()]


def test_a_streamed_chat_through_the_router(router: Router) -> None:
    stream = router.client().chat.completions.create(
        model="tiny",
        messages=[{"role": "user", "content": "hello hello hello"}],
        max_tokens=8,
        temperature=0,
        stream=True,
        stream_options={"include_usage": True},
        extra_headers=LANE,
    )
    chunks = list(stream)
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text and chunks[-1].usage is not None and chunks[-1].usage.completion_tokens == 8


def test_the_router_routes_to_both_lanes_of_the_group(router: Router) -> None:
    client = router.client()
    for lane in ("speculative", "batching"):
        raw = client.chat.completions.with_raw_response.create(
            model="tiny",
            messages=[{"role": "user", "content": "count: one two three"}],
            max_tokens=6,
            temperature=0,
            extra_headers={"X-Speclane-Lane": lane},
        )
        done = raw.parse()
        assert raw.headers["x-speclane-lane"] == lane
        assert done.usage is not None and done.usage.completion_tokens == 6
    rows = admin_lanes(router)
    assert {b["name"]: b["state"] for b in rows["backends"]} == {
        "speculative": "ready",
        "batching": "ready",
    }


def test_a_forced_tool_call_through_the_router(router: Router) -> None:
    done = router.client().chat.completions.create(
        model="tiny",
        messages=ASK,
        tools=[READ],  # type: ignore[list-item]
        tool_choice="required",
        max_tokens=60,
        extra_headers=LANE,
    )
    (call,) = done.choices[0].message.tool_calls or []
    assert call.function.name == "read"  # type: ignore[union-attr]
    assert isinstance(json.loads(call.function.arguments)["path"], str)  # type: ignore[union-attr]


def test_the_anthropic_door(router: Router) -> None:
    body = {
        "model": "tiny",
        "max_tokens": 6,
        "messages": [{"role": "user", "content": "hello"}],
    }
    request = urllib.request.Request(
        router.base_url + "/messages",
        json.dumps(body).encode(),
        {"Content-Type": "application/json", "anthropic-version": "2023-06-01", **LANE},
    )
    with urllib.request.urlopen(request, timeout=120) as resp:
        answer = json.loads(resp.read())
    assert answer["type"] == "message" and answer["usage"]["output_tokens"] == 6


def post_json(url: str, body: dict[str, Any]) -> dict[str, Any]:
    request = urllib.request.Request(
        url, json.dumps(body).encode(), {"Content-Type": "application/json", **LANE}
    )
    with urllib.request.urlopen(request, timeout=120) as resp:
        return json.loads(resp.read())


def test_the_ollama_and_responses_doors(router: Router) -> None:
    root = router.base_url.removesuffix("/v1")
    ask = [{"role": "user", "content": "hello"}]
    ollama = post_json(
        root + "/api/chat",
        {"model": "tiny", "messages": ask, "stream": False, "options": {"num_predict": 5}},
    )
    assert ollama["done"] is True and ollama["eval_count"] == 5
    responses = post_json(
        router.base_url + "/responses",
        {"model": "tiny", "input": "hello", "max_output_tokens": 5},
    )
    assert responses["status"] in ("completed", "incomplete")
    assert responses["usage"]["output_tokens"] == 5


def test_admin_shows_the_ranks_hosts_and_memory_per_host(router: Router) -> None:
    deadline = time.monotonic() + 30
    while True:
        (worker,) = admin_lanes(router)["workers"]
        group = worker["group"]
        if group["host_memory_bytes"] or time.monotonic() > deadline:
            break
        time.sleep(0.5)
    assert worker["lanes"] == ["speculative", "batching"]  # one process: both lanes
    assert group["ranks"] == 2 and group["hosts"] == ["127.0.0.1", "127.0.0.1"]
    assert (group["backend"], group["parallel"]) == ("ring", "tensor")
    assert group["host_memory_bytes"]["127.0.0.1"] > 100 << 20
    assert worker["rss_bytes"] > group["host_memory_bytes"]["127.0.0.1"] // 2  # all local ranks
    gauge = "speclane_group_host_memory_bytes"
    lanes = "speculative+batching"
    assert metric_value(router.metrics(), gauge, lanes=lanes, host="127.0.0.1")


def test_a_killed_rank_brings_the_group_down_and_back(router: Router) -> None:
    before = metric_value(router.metrics(), "speclane_worker_restarts_total", lane="speculative")
    old = ranks(router)
    assert len(old) == 2
    old[-1].send_signal(signal.SIGKILL)
    _, alive = psutil.wait_procs(old, timeout=60)
    assert not alive, "the other rank outlived the killed one"
    deadline = time.monotonic() + 180
    while True:
        text = router.metrics()
        restarts = metric_value(text, "speclane_worker_restarts_total", lane="speculative") or 0
        if (
            restarts > (before or 0)
            and metric_value(text, "speclane_worker_up", lane="speculative") == 1
        ):
            break
        assert time.monotonic() < deadline, "the group was not restarted"
        time.sleep(0.5)
    assert len(ranks(router)) == 2
    done = router.client().chat.completions.create(
        model="tiny", messages=[{"role": "user", "content": "hi"}], max_tokens=4, extra_headers=LANE
    )
    assert done.usage is not None and done.usage.completion_tokens == 4


def test_sigterm_leaves_no_rank(router: Router) -> None:
    """The last test on the module's router (after a rank's restart): it stops it (the
    fixture's stop is then a no-op), which saves starting a router and group of its own."""
    members = [launcher(router), *ranks(router)]
    assert len(members) == 3
    stop_router(router)
    assert router.proc.returncode == 0
    _, alive = psutil.wait_procs(members, timeout=20)
    assert not alive, f"left behind: {[p.pid for p in alive]}"


def test_a_model_loaded_on_demand_runs_over_its_own_group(tmp_path: Path, tiny_model: Path) -> None:
    config = (
        f'model = "{tiny_model}"\ndraft_source = "prompt_lookup"\n'
        f'[[lanes.models]]\nname = "tiny-group"\npath = "{tiny_model}"\n'
        '[lanes.models.group]\nhosts = ["127.0.0.1", "127.0.0.1"]\n'
    )
    router = start_router(tmp_path, config)
    try:
        done = router.client().chat.completions.create(
            model="tiny-group", messages=[{"role": "user", "content": "hi"}], max_tokens=4
        )
        assert done.usage is not None and done.usage.completion_tokens == 4
        rows = admin_lanes(router)["workers"]
        grouped = [w for w in rows if w.get("group")]
        assert len(grouped) == 1 and grouped[0]["lanes"] == ["speculative", "batching"]
        assert grouped[0]["group"]["ranks"] == 2
        members = [psutil.Process(grouped[0]["pid"])]
        members += [
            p for p in members[0].children(recursive=True) if "router.worker" in p.cmdline()
        ]
        assert len(members) == 3
    finally:
        stop_router(router)
    _, alive = psutil.wait_procs(members, timeout=20)
    assert not alive


def test_a_router_killed_outright_leaves_no_rank(tmp_path: Path, tiny_model: Path) -> None:
    router = start_router(tmp_path, group_config(tiny_model))
    members = [launcher(router), *ranks(router)]
    assert len(members) == 3
    router.proc.kill()  # SIGKILL: nothing of the router's shutdown runs
    router.proc.wait(10)
    _, alive = psutil.wait_procs(members, timeout=30)
    assert not alive, f"left behind: {[p.pid for p in alive]}"
