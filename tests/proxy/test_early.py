"""A stream whose model is still loading gets its headers and keep-alive comments while it
waits (router.proxy.early), then its answer, or an error event in its door's shape when
the load fails. Lane workers are tests/fakes/fake_worker.py processes (as in
tests/lanes/test_models.py), one of them slow to start."""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import aiohttp
import anthropic
import httpx
import httpx2
import ollama
import openai
import orjson
import pytest

from router.lanes import group
from router.lanes.process import WorkerCommand
from router.proxy import ondemand
from tests.conftest import RunningRouter, router_settings, run_router
from tests.fakes.upstream import Behaviour, fake_upstream
from tests.lanes.test_models import fake_command, settings_for

SLOW_START = 1.5  # seconds the fake workers of "gamma" and "broken" take to start


def slow_command(
    lane: str, settings: Any, model_dir: Path, draft: Path | None, model_name: str, **kw: Any
) -> WorkerCommand:
    command = fake_command(lane, settings, model_dir, draft, model_name, **kw)
    if model_dir.name not in ("gamma", "broken"):
        return command
    slow = (*command.argv, "--slow-start", str(SLOW_START))
    return dataclasses.replace(command, argv=slow)


@pytest.fixture(autouse=True)
def slow_workers(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    monkeypatch.setattr(group, "build_worker_command", slow_command)
    monkeypatch.setattr(ondemand, "FIRST_TICK", 0.2)
    monkeypatch.setattr(ondemand, "TICK", 0.3)
    yield


async def raw_stream(router: RunningRouter, path: str, body: dict[str, Any]) -> tuple[int, bytes]:
    async with (
        aiohttp.ClientSession() as s,
        s.post(router.url + path, json=body, headers={"x-api-key": "k"}) as resp,
    ):
        return resp.status, await resp.read()


CHAT = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 5, "stream": True}


async def test_a_stream_waiting_for_its_model_gets_comments_then_its_answer(
    tmp_path: Path,
) -> None:
    async with run_router(settings_for(tmp_path)) as router:
        status, body = await raw_stream(router, "/v1/chat/completions", {"model": "gamma", **CHAT})
        # the SDK reads the same kind of stream as any other (comments are skipped)
        stream = await router.client().chat.completions.create(
            model="beta", messages=[{"role": "user", "content": "hi"}], max_tokens=5, stream=True
        )
        text = "".join([c.choices[0].delta.content or "" async for c in stream if c.choices])
    assert status == 200
    assert body.startswith(b": loading gamma "), body[:80]
    assert body.count(b": loading gamma") >= 2
    assert body.endswith(b"data: [DONE]\n\n")
    assert b'"content":"ok"' in body.replace(b" ", b"")
    assert text == "ok"


async def test_a_load_that_fails_ends_the_begun_stream_with_an_error_event(
    tmp_path: Path,
) -> None:
    async with run_router(settings_for(tmp_path)) as router:
        status, openai_body = await raw_stream(
            router, "/v1/chat/completions", {"model": "broken", **CHAT}
        )
        anthropic_status, anthropic_body = await raw_stream(
            router, "/v1/messages", {"model": "broken", **CHAT}
        )
    assert status == 200  # the headers went out while it loaded
    assert openai_body.startswith(b": loading broken ")
    events = [e for e in openai_body.split(b"\n\n") if e.startswith(b"data: {")]
    assert orjson.loads(events[-1][6:])["error"]["code"] == "model_load_failed"
    assert openai_body.endswith(b"data: [DONE]\n\n")
    assert anthropic_status == 200
    assert b"event: error" in anthropic_body and b"model_load_failed" in anthropic_body


async def test_the_anthropic_sdk_streams_through_a_load(tmp_path: Path) -> None:
    async with run_router(settings_for(tmp_path)) as router:
        client = anthropic.AsyncAnthropic(base_url=router.url, api_key="k")
        async with client.messages.stream(
            model="gamma", max_tokens=5, messages=[{"role": "user", "content": "hi"}]
        ) as stream:
            text = await stream.get_final_text()
        await client.close()
    assert text == "ok"


async def test_a_non_streaming_request_waits_without_bytes(tmp_path: Path) -> None:
    async with run_router(settings_for(tmp_path)) as router:
        body = {"model": "gamma", **CHAT, "stream": False}
        status, answer = await raw_stream(router, "/v1/chat/completions", body)
    assert status == 200
    assert orjson.loads(answer)["choices"][0]["message"]["content"] == "ok"


# --- bytes while a long prompt prefills: the relay's wait for the first chunk -------------

PREFILL = {"client_limits": {"stream_keepalive": 0.05}}  # a short tick, not a measured time
HELLO = [{"role": "user", "content": "hi"}]
ANSWER = "w0 w1 w2 w3 w4 "  # the fake upstream's five words


def released(upstream: Any) -> dict[str, Any]:
    """httpx event hooks that let the held upstream answer once the response's headers
    reached the client: they come before the answer only when keep-alives begin it."""

    async def headers_in(response: Any) -> None:
        upstream.release.set()

    return {"response": [headers_in]}


async def raw_prefill(
    router: RunningRouter, upstream: Any, path: str, body: dict[str, Any]
) -> tuple[aiohttp.ClientResponse, bytes]:
    """A stream whose upstream holds its answer until the client has the headers."""
    async with (
        aiohttp.ClientSession() as s,
        s.post(router.url + path, json=body, headers={"x-api-key": "k"}) as resp,
    ):
        assert not upstream.release.is_set()  # the headers came while the upstream held
        upstream.release.set()
        return resp, await resp.read()


async def test_a_long_prefill_begins_each_doors_stream_with_its_keep_alive() -> None:
    async with fake_upstream() as fake, run_router(router_settings(fake, **PREFILL)) as r:
        doors = {
            "/v1/chat/completions": {"messages": HELLO, "max_tokens": 5, "stream": True},
            "/v1/completions": {"prompt": "hi", "max_tokens": 5, "stream": True},
            "/v1/responses": {"input": "hi", "stream": True},
            "/v1/messages": {"messages": HELLO, "max_tokens": 5, "stream": True},
            "/api/chat": {"messages": HELLO},
            "/api/generate": {"prompt": "hi"},
        }
        seen = {}
        for path, body in doors.items():
            fake.release = asyncio.Event()
            seen[path] = await raw_prefill(r, fake, path, {"model": "fake-model", **body})
    for path, (resp, _) in seen.items():
        assert resp.status == 200, path
        assert resp.headers["X-Speclane-Decision"], path  # the decision's headers went too
    assert seen["/v1/chat/completions"][1].startswith(b": waiting ")
    assert seen["/v1/chat/completions"][1].endswith(b"data: [DONE]\n\n")
    assert seen["/v1/completions"][1].startswith(b": waiting ")
    assert seen["/v1/responses"][1].startswith(b": waiting ")
    assert b"response.completed" in seen["/v1/responses"][1]
    anthropic_body = seen["/v1/messages"][1]
    assert anthropic_body.startswith(b'event: ping\ndata: {"type":"ping"}\n\n')
    assert b"event: message_stop" in anthropic_body
    for path, field in (("/api/chat", "message"), ("/api/generate", "response")):
        resp, body = seen[path]
        assert resp.headers["Content-Type"].startswith("application/x-ndjson")
        lines = [orjson.loads(line) for line in body.splitlines()]
        first = lines[0]
        assert first["done"] is False and first["model"] == "fake-model", first
        assert (first[field]["content"] if field == "message" else first[field]) == ""
        assert lines[-1]["done"] is True


async def test_the_official_clients_read_through_the_keep_alives() -> None:
    async with fake_upstream() as fake, run_router(router_settings(fake, **PREFILL)) as r:
        fake.release = asyncio.Event()
        async with openai.AsyncOpenAI(
            base_url=r.base_url,
            api_key="k",
            max_retries=0,
            http_client=httpx.AsyncClient(event_hooks=released(fake)),
        ) as client:
            stream = await client.chat.completions.create(
                model="fake-model", messages=HELLO, max_tokens=5, stream=True
            )
            chat = "".join([c.choices[0].delta.content or "" async for c in stream if c.choices])
            fake.release = asyncio.Event()
            async with client.responses.stream(model="fake-model", input="hi") as events:
                final = await events.get_final_response()
        fake.release = asyncio.Event()
        async with anthropic.AsyncAnthropic(
            base_url=r.url,
            api_key="k",
            max_retries=0,
            # this SDK's own httpx fork
            http_client=httpx2.AsyncClient(event_hooks=released(fake)),
        ) as claude:
            async with claude.messages.stream(
                model="fake-model", max_tokens=5, messages=HELLO
            ) as message:
                text = await message.get_final_text()
        fake.release = asyncio.Event()
        llama = ollama.AsyncClient(host=r.url, event_hooks=released(fake))
        parts = [
            part.message.content or ""
            async for part in await llama.chat(model="fake-model", messages=HELLO, stream=True)
        ]
    assert chat == ANSWER and final.output_text == ANSWER and text == ANSWER
    assert "".join(parts) == ANSWER and parts[0] == ""  # the keep-alive: a chunk without text


async def test_retries_go_on_behind_keep_alives_and_a_failure_ends_the_begun_stream() -> None:
    body = {"model": "fake-model", "messages": HELLO, "max_tokens": 5, "stream": True}
    seen = {}
    for path in ("/v1/chat/completions", "/v1/messages", "/api/chat"):
        # a router each: three failed attempts cool the backend down
        async with (
            fake_upstream(behaviour=Behaviour(status=503)) as fake,
            run_router(router_settings(fake, **PREFILL)) as r,
        ):
            fake.release = asyncio.Event()
            resp, raw = await raw_prefill(r, fake, path, body)
            seen[path] = (resp.status, raw, len(fake.requests), r.services.access.recent[-1])
    status, openai_body, tried, record = seen["/v1/chat/completions"]
    assert status == 200 and openai_body.startswith(b": waiting ")
    assert tried == 3 and record.attempts == 3  # every attempt, after the keep-alives began
    assert record.status == 503  # booked as what the client got in the end
    events = [e for e in openai_body.split(b"\n\n") if e.startswith(b"data: {")]
    assert orjson.loads(events[-1][6:])["error"]["message"]
    assert openai_body.endswith(b"data: [DONE]\n\n")
    status, anthropic_body, _, _ = seen["/v1/messages"]
    assert status == 200 and anthropic_body.startswith(b"event: ping")
    assert b"event: error" in anthropic_body
    status, ollama_body, _, _ = seen["/api/chat"]
    assert status == 200 and "error" in orjson.loads(ollama_body.splitlines()[-1])


async def test_a_shutdown_during_the_keep_alives_ends_the_stream_with_its_error() -> None:
    async with fake_upstream() as fake, run_router(router_settings(fake, **PREFILL)) as r:
        fake.release = asyncio.Event()  # never set: the prefill outlasts the shutdown
        body = {"model": "fake-model", "messages": HELLO, "max_tokens": 5, "stream": True}
        async with (
            aiohttp.ClientSession() as s,
            s.post(r.base_url + "/chat/completions", json=body) as resp,
        ):
            assert resp.status == 200  # begun by its keep-alives
            await r.services.relay.shutdown(0, settle=5)
            raw = await resp.read()
        record = r.services.access.recent[-1]
    assert raw.startswith(b": waiting ")
    events = [e for e in raw.split(b"\n\n") if e.startswith(b"data: {")]
    assert orjson.loads(events[-1][6:])["error"]["code"] == "shutting_down"
    assert raw.endswith(b"data: [DONE]\n\n")
    assert record.status == 503
