"""A stream whose model is still loading gets its headers and keep-alive comments while it
waits (router.proxy.early), then its answer, or an error event in its door's shape when
the load fails. Lane workers are tests/fakes/fake_worker.py processes (as in
tests/lanes/test_models.py), one of them slow to start."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import aiohttp
import anthropic
import orjson
import pytest

from router.lanes import group
from router.lanes.process import WorkerCommand
from router.proxy import ondemand
from tests.conftest import RunningRouter, run_router
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
