"""Classification and policy end to end: openai client -> speclane -> two fake lanes.

Each test writes real policy files, starts a real router whose lanes are fake upstreams,
and checks where requests went and what the response headers say about it.
"""

from __future__ import annotations

import asyncio
import os
import signal
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import aiohttp
import openai
import pytest

from tests.conftest import (
    RunningRouter,
    add_fake_lane,
    fake_upstreams,
    router_settings,
    run_router,
    wait_until,
)
from tests.fakes.upstream import Behaviour, FakeUpstream

CHAT = [{"role": "user", "content": "hi"}]
MODEL = "fake-model"

POLICIES_TEXT = {
    "default.toml": 'client = "default"\nallow_lane_override = false\n',
    "openclaw.toml": """
client = "openclaw"
priority = 10
default_preset = "interactive"
[lanes]
interactive = "speculative"
throughput = "batching"
[match]
client_header = ["openclaw"]
user_agent = ["(?i)openclaw"]
""",
    "batchjob.toml": """
client = "batchjob"
priority = -5
default_preset = "throughput"
allow_lane_override = false
max_concurrency = 1
queue_timeout = 0.3
[match]
api_keys = ["sk-batch-0123456789"]
""",
    "debugger.toml": """
client = "debugger"
allow_lane_override = true
[match]
client_header = ["debugger"]
""",
}


def write_policies(directory: Path, texts: dict[str, str]) -> None:
    for name, text in texts.items():
        (directory / name).write_text(text)


@asynccontextmanager
async def policy_router(
    tmp_path: Path, texts: dict[str, str] = POLICIES_TEXT, **overrides: object
) -> AsyncIterator[tuple[RunningRouter, FakeUpstream, FakeUpstream]]:
    write_policies(tmp_path, texts)
    async with fake_upstreams("spec", "batch") as (spec, batch):
        settings = router_settings(backends=[], policies_dir=str(tmp_path), **overrides)

        def lanes(wired: object) -> None:
            add_fake_lane(wired, "speculative", spec)  # type: ignore[arg-type]
            add_fake_lane(wired, "batching", batch)  # type: ignore[arg-type]

        async with run_router(settings, setup=lanes) as r:
            yield r, spec, batch


async def chat_headers(client: openai.AsyncOpenAI, **kw: object) -> dict[str, str]:
    raw = await client.chat.completions.with_raw_response.create(
        model=kw.pop("model", MODEL), messages=CHAT, **kw
    )  # type: ignore[arg-type]
    return {k.lower(): v for k, v in raw.headers.items() if k.lower().startswith("x-speclane")}


async def test_clients_identified_by_key_header_and_user_agent(tmp_path: Path) -> None:
    async with policy_router(tmp_path) as (r, _, _):
        by_key = await chat_headers(r.client(api_key="sk-batch-0123456789"))
        by_header = await chat_headers(r.client(default_headers={"X-Speclane-Client": "openclaw"}))
        by_agent = await chat_headers(r.client(default_headers={"User-Agent": "OpenClaw/2.1"}))
        nobody = await chat_headers(r.client())
    assert by_key["x-speclane-client"] == "batchjob"
    assert by_header["x-speclane-client"] == "openclaw"
    assert by_agent["x-speclane-client"] == "openclaw"
    assert nobody["x-speclane-client"] == "default"


async def test_two_clients_get_different_lanes_for_the_same_request(tmp_path: Path) -> None:
    async with policy_router(tmp_path) as (r, spec, batch):
        agent = await chat_headers(r.client(default_headers={"X-Speclane-Client": "openclaw"}))
        job = await chat_headers(r.client(api_key="sk-batch-0123456789"))
    assert agent["x-speclane-lane"] == "speculative"
    assert agent["x-speclane-decision"] == "preset=interactive,spec-lane-free->speculative"
    assert job["x-speclane-lane"] == "batching"
    assert job["x-speclane-decision"].startswith("preset=throughput,")
    assert len(spec.requests) == 1 and len(batch.requests) == 1


async def test_preset_by_header_and_by_model_suffix(tmp_path: Path) -> None:
    async with policy_router(tmp_path) as (r, _, batch):
        client = r.client(default_headers={"X-Speclane-Client": "openclaw"})
        by_header = await chat_headers(client, extra_headers={"X-Speclane-Preset": "throughput"})
        by_suffix = await chat_headers(client, model=f"{MODEL}@throughput")
        with pytest.raises(openai.BadRequestError, match=r"interactive.*throughput"):
            await client.chat.completions.create(
                model=MODEL, messages=CHAT, extra_headers={"X-Speclane-Preset": "warp"}
            )
    assert by_header["x-speclane-lane"] == by_suffix["x-speclane-lane"] == "batching"
    assert by_suffix["x-speclane-decision"].startswith("preset=throughput")
    assert batch.requests[-1].body["model"] == MODEL  # the suffix never reaches the backend


async def test_override_allowed_forced_and_refused(tmp_path: Path) -> None:
    async with policy_router(tmp_path) as (r, spec, batch):
        debugger = r.client(default_headers={"X-Speclane-Client": "debugger"})
        forced = await chat_headers(debugger, extra_headers={"X-Speclane-Lane": "batching"})
        with pytest.raises(openai.PermissionDeniedError):
            await r.client(api_key="sk-batch-0123456789").chat.completions.create(
                model=MODEL, messages=CHAT, extra_headers={"X-Speclane-Lane": "speculative"}
            )
        with pytest.raises(openai.BadRequestError):
            await debugger.chat.completions.create(
                model=MODEL,
                messages=CHAT,
                extra_headers={"X-Speclane-Lane": "http://evil.example/v1"},
            )
    assert forced["x-speclane-lane"] == "batching"
    assert forced["x-speclane-decision"] == "override->batching"
    assert len(batch.requests) == 1 and not spec.requests  # the refused ones went nowhere


async def test_load_moves_requests_to_batching_and_back(tmp_path: Path) -> None:
    async with policy_router(tmp_path) as (r, spec, _):
        spec.behaviour = Behaviour(chunks=2, stall_after=1)  # holds the speculative lane
        client = r.client(default_headers={"X-Speclane-Client": "openclaw"})
        held = await client.chat.completions.create(model=MODEL, messages=CHAT, stream=True)
        await anext(held.__aiter__())
        busy = await chat_headers(client)
        await held.close()
        await wait_until(lambda: r.services.pool["speculative"].inflight == 0)
        spec.behaviour = Behaviour()
        free = await chat_headers(client)
    assert busy["x-speclane-lane"] == "batching"
    assert "spec-lane-busy" in busy["x-speclane-decision"]
    assert free["x-speclane-lane"] == "speculative"


async def test_concurrency_limit_queues_then_429_with_retry_after(tmp_path: Path) -> None:
    async with policy_router(tmp_path) as (r, _, batch):
        batch.behaviour = Behaviour(chunks=2, stall_after=1)
        client = r.client(api_key="sk-batch-0123456789")
        held = await client.chat.completions.create(model=MODEL, messages=CHAT, stream=True)
        await anext(held.__aiter__())
        with pytest.raises(openai.RateLimitError) as info:
            await client.chat.completions.create(model=MODEL, messages=CHAT)
        await held.close()
    assert int(info.value.response.headers["retry-after"]) >= 1
    assert info.value.response.headers["x-speclane-client"] == "batchjob"
    assert len(batch.requests) == 1  # the refused request never reached a backend


async def test_queued_request_is_served_when_the_slot_frees(tmp_path: Path) -> None:
    texts = {
        **POLICIES_TEXT,
        "batchjob.toml": POLICIES_TEXT["batchjob.toml"].replace(
            "queue_timeout = 0.3", "queue_timeout = 10"
        ),
    }
    async with policy_router(tmp_path, texts) as (r, _, batch):
        batch.behaviour = Behaviour(delay_headers=0.5)
        client = r.client(api_key="sk-batch-0123456789")
        first = asyncio.create_task(chat_headers(client))
        second = asyncio.create_task(chat_headers(client))
        done = await asyncio.gather(first, second)
    waits = sorted(float(h["x-speclane-queue-ms"]) for h in done)
    assert waits[0] < 50 and waits[1] > 300  # the second waited for the first


async def test_reload_on_file_change_and_bad_reload_keeps_old(tmp_path: Path) -> None:
    async with policy_router(tmp_path, policy_poll_interval=0.05) as (r, _, _):
        watcher = r.services.policies
        client = r.client(default_headers={"X-Speclane-Client": "newbie"})
        assert (await chat_headers(client))["x-speclane-client"] == "default"
        attempts = watcher.attempts
        (tmp_path / "newbie.toml").write_text(
            'client = "newbie"\n[match]\nclient_header = ["newbie"]\n'
        )
        assert (await watcher.wait_reload(attempts)).ok
        assert (await chat_headers(client))["x-speclane-client"] == "newbie"
        attempts = watcher.attempts
        (tmp_path / "broken.toml").write_text("client = [")
        result = await watcher.wait_reload(attempts)
        assert not result.ok and "broken.toml" in (result.error or "")
        assert (await chat_headers(client))["x-speclane-client"] == "newbie"  # old set kept


@pytest.mark.skipif(not hasattr(signal, "SIGHUP"), reason="no SIGHUP on this platform")
async def test_reload_on_sighup(tmp_path: Path) -> None:
    async with policy_router(tmp_path, policy_poll_interval=3600) as (r, _, _):
        watcher = r.services.policies
        attempts = watcher.attempts
        (tmp_path / "hup.toml").write_text('client = "hup"\n[match]\nclient_header = ["hup"]\n')
        os.kill(os.getpid(), signal.SIGHUP)
        result = await watcher.wait_reload(attempts)
        assert result.ok and result.trigger == "sighup"
        headers = await chat_headers(r.client(default_headers={"X-Speclane-Client": "hup"}))
    assert headers["x-speclane-client"] == "hup"


async def test_a_protected_client_named_without_its_key_is_the_default(tmp_path: Path) -> None:
    """The header opens nothing the default would not give (and reveals nothing)."""
    texts = {
        **POLICIES_TEXT,
        "batchjob.toml": POLICIES_TEXT["batchjob.toml"].replace(
            "[match]", 'require_api_key = true\n[match]\nclient_header = ["batchjob"]'
        ),
    }
    async with policy_router(tmp_path, texts) as (r, _, _):
        client = r.client(default_headers={"X-Speclane-Client": "batchjob"})
        assert (await chat_headers(client))["x-speclane-client"] == "default"


async def test_a_lane_counts_as_busy_before_it_answers(tmp_path: Path) -> None:
    """A lane worker sends headers only with its first token: a request that arrives while
    the speculative lane is still prefilling must already see it busy."""
    async with policy_router(tmp_path) as (r, spec, batch):
        spec.behaviour = Behaviour(delay_headers=1.0)  # queue + prefill before any header
        client = r.client(default_headers={"X-Speclane-Client": "openclaw"})
        first = asyncio.create_task(chat_headers(client))
        await asyncio.wait_for(spec.request_started.wait(), 5)
        second = await chat_headers(client)
        assert (await first)["x-speclane-lane"] == "speculative"
    assert second["x-speclane-lane"] == "batching"
    assert "spec-lane-busy" in second["x-speclane-decision"]
    assert len(spec.requests) == 1 and len(batch.requests) == 1


async def test_a_conversation_goes_back_to_the_lane_holding_its_prefix(tmp_path: Path) -> None:
    system = {"role": "system", "content": "You are a coding agent. " * 50}
    turn1 = [system, {"role": "user", "content": "read main.py"}]
    turn2 = [
        *turn1,
        {"role": "assistant", "content": "done"},
        {"role": "user", "content": "now fix it"},
    ]
    other = [{"role": "system", "content": "Another agent."}, {"role": "user", "content": "hi"}]
    async with policy_router(tmp_path) as (r, spec, batch):
        client = r.client(default_headers={"X-Speclane-Client": "openclaw"})

        async def headers(messages: list[dict[str, str]], **kw: object) -> dict[str, str]:
            raw = await client.chat.completions.with_raw_response.create(
                model=MODEL, messages=messages, **kw
            )  # type: ignore[arg-type]
            return {k.lower(): v for k, v in raw.headers.items()}

        first = await headers(turn1, extra_headers={"X-Speclane-Preset": "throughput"})
        second = await headers(turn2)  # interactive: the speculative lane, but for the cache
        fresh = await headers(other)
    assert first["x-speclane-lane"] == "batching"
    assert second["x-speclane-lane"] == "batching"
    assert second["x-speclane-decision"] == "preset=interactive,cache-affinity->batching"
    assert fresh["x-speclane-decision"] == "preset=interactive,spec-lane-free->speculative"
    assert len(batch.requests) == 2 and len(spec.requests) == 1


async def test_the_lanes_pace_is_measured_from_their_streamed_answers(tmp_path: Path) -> None:
    system = {"role": "system", "content": "You are a coding agent. " * 50}
    turn1 = [system, {"role": "user", "content": "read main.py"}]
    turn2 = [*turn1, {"role": "assistant", "content": "done"}, {"role": "user", "content": "fix"}]
    async with policy_router(tmp_path) as (r, _spec, batch):
        batch.behaviour = Behaviour(chunks=20, interval=0.005)
        client = r.client(default_headers={"X-Speclane-Client": "openclaw"})
        for messages, preset in ((turn1, "throughput"), (turn2, "interactive")):
            stream = await client.chat.completions.create(
                model=MODEL,
                messages=messages,  # type: ignore[arg-type]
                stream=True,
                stream_options={"include_usage": True},  # a lane's worker always sends it
                extra_headers={"X-Speclane-Preset": preset},
            )
            async for _ in stream:
                pass
        paces = r.services.routing.paces.snapshot()
        async with aiohttp.ClientSession() as http, http.get(f"{r.url}/admin/lanes") as resp:
            shown = (await resp.json())["pace"]
    measured = paces.lanes["batching"]
    assert measured.cold_s_per_char is not None  # turn 1: nothing held it
    assert measured.held_s is not None  # turn 2: back on the lane holding its prefix
    assert measured.moved_s_per_char is None
    assert set(measured.per_token) == {1} and measured.per_token[1] > 0  # alone on the lane
    assert "speculative" not in paces.lanes
    assert paces.output_tokens == pytest.approx(19)  # the tokens after the first
    assert set(shown["lanes"]) == {"batching"}
    assert shown["lanes"]["batching"]["seconds_per_token"].keys() == {"1"}
    assert shown["lanes"]["batching"]["moved_first_token_s_per_char"] is None
    assert shown["output_tokens"] == pytest.approx(19)
