"""count_tokens as a request like any other, and one body limit on every door.

The lane is the real worker's HTTP side (``router.worker.http.server``) around a scripted engine
whose tokenizer counts characters, behind a real router; the clients are the official ones.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from types import SimpleNamespace

import aiohttp
import anthropic
import ollama
import openai
import pytest

from router.config.settings import Settings
from router.kernel.worker_contract import worker_argv
from router.worker.http.server import WorkerInfo, make_worker_app, start_site
from tests.conftest import (
    RunningRouter,
    add_fake_lane,
    metric_value,
    router_settings,
    run_router,
    wait_until,
)
from tests.worker.scripted import ScriptedEngine

MODEL = "scripted-model"
KEY = "sk-count-0123456789"
LIMITED = f'max_concurrency = 1\nqueue_timeout = {{timeout}}\n[match]\napi_keys = ["{KEY}"]\n'
WAIT = 10.0


def lane_body_limit(settings: Settings) -> int:
    """The worker's --max-body-bytes, as the supervisor would start it for ``settings``."""
    argv = worker_argv(
        "python",
        "batching",
        Path("/m"),
        MODEL,
        draft=None,
        num_draft_tokens=0,
        max_batch_size=1,
        parent_pid=1,
        max_body_bytes=settings.max_body_bytes,
    )
    return int(argv[argv.index("--max-body-bytes") + 1])


@asynccontextmanager
async def scripted_router(
    engine: ScriptedEngine, tmp_path: Path, policy: str | None = None, **info_fields: object
) -> AsyncIterator[RunningRouter]:
    """A router whose batching lane is the worker's HTTP side around ``engine``."""
    if policy is not None:
        (tmp_path / "counter.toml").write_text(policy)
    settings = router_settings(backends=[], policies_dir=str(tmp_path))
    engine.start()
    info = WorkerInfo(
        mode="batching",
        model_name=MODEL,
        draft_name=None,
        num_draft_tokens=0,
        **info_fields,  # type: ignore[arg-type]
    )
    runner, port = await start_site(
        make_worker_app(engine, info, lane_body_limit(settings)), "127.0.0.1", 0
    )
    lane = SimpleNamespace(models=(MODEL,), base_url=f"http://127.0.0.1:{port}/v1")
    try:
        async with run_router(
            settings, setup=lambda wired: add_fake_lane(wired, "batching", lane)
        ) as r:  # type: ignore[arg-type]
            yield r
    finally:
        if engine._steps is not None:  # a paced engine: let a left-over job finish
            engine.release(1000)
        await asyncio.to_thread(engine.stop, 2.0)
        await runner.cleanup()


def root(r: RunningRouter) -> str:
    return r.base_url.removesuffix("/v1")


def claude(r: RunningRouter, key: str = "local") -> anthropic.AsyncAnthropic:
    return anthropic.AsyncAnthropic(base_url=root(r), api_key=key, max_retries=0, timeout=WAIT)


MESSAGES = [{"role": "user", "content": "hello"}]


async def test_count_tokens_waits_in_its_clients_queue_and_gets_a_429_past_it(
    tmp_path: Path,
) -> None:
    engine = ScriptedEngine("ok", paced=True)
    async with scripted_router(engine, tmp_path, LIMITED.format(timeout=WAIT)) as r:
        client = claude(r, KEY)
        limiter = r.services.limiter
        generation = asyncio.ensure_future(
            client.messages.create(model=MODEL, max_tokens=4, messages=MESSAGES)
        )  # type: ignore[arg-type]
        await wait_until(lambda: engine.started, WAIT)  # holds the client's one slot
        count = asyncio.ensure_future(client.messages.count_tokens(model=MODEL, messages=MESSAGES))  # type: ignore[arg-type]
        await wait_until(lambda: limiter.queued("counter") == 1, WAIT)
        assert not count.done()
        engine.release(2)
        await generation
        counted = await count
        await client.close()
    assert counted.input_tokens == len("<user>hello")


async def test_count_tokens_past_the_queue_timeout_is_a_429_in_anthropics_shape(
    tmp_path: Path,
) -> None:
    engine = ScriptedEngine("ok", paced=True)
    async with scripted_router(engine, tmp_path, LIMITED.format(timeout=0.2)) as r:
        client = claude(r, KEY)
        generation = asyncio.ensure_future(
            client.messages.create(model=MODEL, max_tokens=4, messages=MESSAGES)
        )  # type: ignore[arg-type]
        await wait_until(lambda: engine.started, WAIT)
        with pytest.raises(anthropic.RateLimitError) as refused:
            await client.messages.count_tokens(model=MODEL, messages=MESSAGES)  # type: ignore[arg-type]
        engine.release(2)
        await generation
        await client.close()
    assert refused.value.body["type"] == "error"  # type: ignore[index]
    assert refused.value.response.headers["retry-after"]


async def test_count_tokens_is_booked_like_any_request(tmp_path: Path) -> None:
    """Counted or refused, a count is in the access log and in speclane_requests_total."""
    engine = ScriptedEngine("ok", paced=True)
    async with scripted_router(engine, tmp_path, LIMITED.format(timeout=0.2)) as r:
        client = claude(r, KEY)
        await client.messages.count_tokens(model=MODEL, messages=MESSAGES)  # type: ignore[arg-type]
        generation = asyncio.ensure_future(
            client.messages.create(model=MODEL, max_tokens=4, messages=MESSAGES)
        )  # type: ignore[arg-type]
        await wait_until(lambda: engine.started, WAIT)
        with pytest.raises(anthropic.RateLimitError):
            await client.messages.count_tokens(model=MODEL, messages=MESSAGES)  # type: ignore[arg-type]
        engine.release(2)
        await generation
        await client.close()
        counts = [a for a in r.services.access.recent if a.endpoint == "count_tokens"]
        text = r.services.metrics.render().decode()
    assert [(a.client, a.model, a.status) for a in counts] == [
        ("counter", MODEL, 200),
        ("counter", MODEL, 429),
    ]
    assert counts[0].backend is not None and counts[1].error is not None
    for status in ("200", "429"):
        assert (
            metric_value(
                text,
                "speclane_requests_total",
                endpoint="count_tokens",
                status=status,
                api="anthropic",
            )
            == 1
        )


# --- one body limit -----------------------------------------------------------------------

BIG = 1_500_000  # past aiohttp's own 1 MiB default, well within max_body_bytes (8 MiB)


async def test_a_big_chat_and_its_count_reach_the_lane(tmp_path: Path) -> None:
    engine = ScriptedEngine("ok")
    async with scripted_router(engine, tmp_path) as r:
        big = [{"role": "user", "content": "x" * BIG}]
        reply = await r.client().chat.completions.create(model=MODEL, messages=big, max_tokens=2)  # type: ignore[arg-type]
        async with claude(r) as client:
            counted = await client.messages.count_tokens(model=MODEL, messages=big)  # type: ignore[arg-type]
    assert reply.choices[0].message.content == "ok"
    assert counted.input_tokens == len("<user>") + BIG


async def test_a_body_past_the_limit_is_a_413_in_each_doors_shape(tmp_path: Path) -> None:
    engine = ScriptedEngine("ok")
    async with scripted_router(engine, tmp_path) as r:
        limit = 8 * 1024 * 1024
        huge = [{"role": "user", "content": "x" * (limit + 1)}]
        with pytest.raises(openai.APIStatusError) as by_openai:
            await r.client().chat.completions.create(model=MODEL, messages=huge)  # type: ignore
        async with claude(r) as client:
            with pytest.raises(anthropic.APIStatusError) as by_messages:
                await client.messages.create(model=MODEL, max_tokens=2, messages=huge)  # type: ignore[arg-type]
            with pytest.raises(anthropic.APIStatusError) as by_count:
                await client.messages.count_tokens(model=MODEL, messages=huge)  # type: ignore[arg-type]
        by_ollama = []
        for call in ("chat", "generate"):
            with pytest.raises(ollama.ResponseError) as refused:
                client_o = ollama.AsyncClient(host=root(r), timeout=WAIT)
                if call == "chat":
                    await client_o.chat(model=MODEL, messages=huge)
                else:
                    await client_o.generate(model=MODEL, prompt=huge[0]["content"])
            by_ollama.append(refused.value)
        async with aiohttp.ClientSession() as session:
            async with session.post(
                r.base_url + "/completions", json={"model": MODEL, "prompt": "x" * (limit + 1)}
            ) as resp:
                completions = (resp.status, await resp.json())
    assert by_openai.value.status_code == 413
    assert by_openai.value.code == "body_too_large"
    for refused_a in (by_messages.value, by_count.value):
        assert refused_a.status_code == 413
        assert refused_a.body["type"] == "error"  # type: ignore[index]
        assert "larger than the limit" in refused_a.body["error"]["message"]  # type: ignore
    for refused_o in by_ollama:
        assert refused_o.status_code == 413 and "larger than the limit" in refused_o.error
    assert completions[0] == 413 and completions[1]["error"]["code"] == "body_too_large"
    assert engine.started == []  # nothing reached the lane


async def test_a_tool_use_too_deeply_nested_to_forward_is_a_400(tmp_path: Path) -> None:
    """Not a 500: orjson reads 1,024 levels of nesting but writes only 254; the one depth
    rule refuses it as the body is read."""
    deep: object = "x"
    for _ in range(300):
        deep = [deep]
    engine = ScriptedEngine("ok")
    body = {
        "model": MODEL,
        "max_tokens": 4,
        "messages": [
            {"role": "user", "content": "hi"},
            {
                "role": "assistant",
                "content": [{"type": "tool_use", "id": "t1", "name": "f", "input": {"a": deep}}],
            },
            {"role": "user", "content": "go"},
        ],
    }
    answers = []
    async with scripted_router(engine, tmp_path) as r, aiohttp.ClientSession() as session:
        for path in ("/v1/messages", "/v1/messages/count_tokens"):
            async with session.post(root(r) + path, json=body) as resp:
                answers.append((resp.status, await resp.json()))
    for status, answer in answers:
        assert status == 400, answer
        assert answer["type"] == "error" and "[body_too_deep]" in answer["error"]["message"]
    assert engine.started == []


async def test_every_listing_reports_the_context_its_lane_reports(tmp_path: Path) -> None:
    (tmp_path / "default.toml").write_text('client = "default"\n[caps]\nmax_tokens = 1024\n')
    engine = ScriptedEngine("ok")
    async with scripted_router(
        engine, tmp_path, None, context_length=8192, architecture="llama"
    ) as r:
        lane = r.services.pool["batching"]
        # what the supervisor does with each /health answer of the worker
        async with aiohttp.ClientSession() as s, s.get(lane.root_url + "/health") as resp:
            lane.lane_status(True, None, await resp.json(), None)
        openai_models = await r.client().models.list()
        async with claude(r) as client:
            anthropic_models = await client.models.list()
        llama = ollama.AsyncClient(host=root(r), timeout=WAIT)
        shown = await llama.show(MODEL)
        running = await llama.ps()
    row = openai_models.data[0].model_dump()
    assert (row["id"], row["context_length"], row["max_model_len"]) == (MODEL, 8192, 8192)
    info = anthropic_models.data[0]
    assert (info.id, info.max_input_tokens, info.max_tokens) == (MODEL, 8192, 1024)
    assert info.type == "model" and info.lifecycle == "active"
    assert shown.modelinfo is not None
    assert shown.modelinfo["general.architecture"] == "llama"
    assert shown.modelinfo["llama.context_length"] == 8192
    assert running.models[0].context_length == 8192
