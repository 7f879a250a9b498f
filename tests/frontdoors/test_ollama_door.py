"""Ollama's API through the official ollama client, against loopback fake upstreams."""

from __future__ import annotations

from pathlib import Path

import aiohttp
import ollama
import orjson
import pytest

from tests.conftest import lanes_router, metric_value, router_settings, run_router
from tests.fakes.upstream import Behaviour, FakeUpstream, fake_upstream
from tests.frontdoors.conftest import TOOL_ARGS, tool_call_body, tool_call_stream

MODEL = "fake-model"
HELLO = [{"role": "user", "content": "Hello"}]
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "Weather in a city",
            "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
        },
    }
]


def client(url: str, **headers: str) -> ollama.AsyncClient:
    return ollama.AsyncClient(host=url, headers=headers or None, timeout=30)


async def test_chat_streams_ndjson_on_the_lane_the_header_asks_for() -> None:
    async with (
        fake_upstream(name="spec") as spec,
        fake_upstream(name="batch") as batch,
        lanes_router(spec, batch) as r,
    ):
        parts = [
            p
            async for p in await client(r.url, **{"X-Speclane-Lane": "batching"}).chat(
                model=MODEL,
                messages=HELLO,
                stream=True,
                options={
                    "temperature": 0.2,
                    "num_predict": 9,
                    "stop": ["END"],
                    "seed": 3,
                    "num_ctx": 4096,
                    "top_k": 4,
                },
                keep_alive="5m",
            )
        ]
        async with aiohttp.ClientSession() as s, s.get(f"{r.url}/metrics") as resp:
            metrics = await resp.text()
    assert not spec.requests and len(batch.requests) == 1
    sent = batch.requests[0].body
    assert (sent["temperature"], sent["max_tokens"], sent["stop"], sent["seed"], sent["top_k"]) == (
        0.2,
        9,
        ["END"],
        3,
        4,
    )
    assert "".join(p.message.content or "" for p in parts) == "w0 w1 w2 w3 w4 "
    assert [p.done for p in parts] == [False] * 5 + [True]
    last = parts[-1]
    assert last.done_reason == "stop"
    assert (last.prompt_eval_count, last.eval_count) == (7, 5)
    assert last.total_duration >= last.eval_duration > 0  # type: ignore[operator]
    assert last.total_duration >= last.prompt_eval_duration  # type: ignore[operator]
    assert metric_value(metrics, "speclane_requests_total", api="ollama", status="200") == 1


async def test_chat_and_generate_without_streaming(fake: FakeUpstream) -> None:
    async with run_router(router_settings(fake)) as r:
        c = client(r.url)
        chat = await c.chat(model=MODEL, messages=HELLO, stream=False)
        gen = await c.generate(model=MODEL, prompt="Hi", system="Be brief.", stream=False)
        raw = await c.generate(model=MODEL, prompt="<s>Hi", raw=True, stream=False)
        loaded = await c.generate(model=MODEL)  # no prompt: Ollama's "load the model"
    assert chat.message.content == "w0 w1 w2 w3 w4" and chat.done and chat.eval_count == 5
    assert gen.response == "w0 w1 w2 w3 w4" and gen.done_reason == "stop"
    assert raw.response == "w0 w1 w2 w3 w4"
    assert loaded.done and loaded.done_reason == "load"
    paths = [seen.path for seen in fake.requests]
    assert paths == ["/v1/chat/completions", "/v1/chat/completions", "/v1/completions"]
    assert fake.requests[1].body["messages"] == [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Hi"},
    ]
    assert fake.requests[2].body["prompt"] == "<s>Hi"


@pytest.mark.parametrize("stream", [False, True], ids=["json", "stream"])
async def test_tool_round_trip(fake: FakeUpstream, stream: bool) -> None:
    fake.then(tool_call_stream() if stream else tool_call_body(), Behaviour())
    async with run_router(router_settings(fake)) as r:
        c = client(r.url)
        if stream:
            parts = [
                p async for p in await c.chat(model=MODEL, messages=HELLO, tools=TOOLS, stream=True)
            ]
            calls = [call for p in parts for call in (p.message.tool_calls or [])]
            assert parts[-1].done
        else:
            answer = await c.chat(model=MODEL, messages=HELLO, tools=TOOLS, stream=False)
            calls = list(answer.message.tool_calls or [])
        assert len(calls) == 1
        assert calls[0].function.name == "get_weather"
        assert dict(calls[0].function.arguments) == TOOL_ARGS
        await c.chat(
            model=MODEL,
            stream=False,
            messages=[
                *HELLO,
                {"role": "assistant", "content": "", "tool_calls": [calls[0]]},
                {"role": "tool", "content": "sunny", "tool_name": "get_weather"},
            ],
        )
    assert fake.requests[0].body["tools"] == TOOLS
    follow = fake.requests[1].body["messages"]
    call = follow[1]["tool_calls"][0]
    assert call["function"]["name"] == "get_weather"
    assert orjson.loads(call["function"]["arguments"]) == TOOL_ARGS
    assert follow[2] == {"role": "tool", "content": "sunny", "tool_call_id": call["id"]}


async def test_format_becomes_response_format(fake: FakeUpstream) -> None:
    schema = {"type": "object", "properties": {"a": {"type": "integer"}}}
    fake.then(Behaviour(), Behaviour(status=400, error_message="response_format: unsupported"))
    async with run_router(router_settings(fake)) as r:
        c = client(r.url)
        await c.chat(model=MODEL, messages=HELLO, format="json", stream=False)
        with pytest.raises(ollama.ResponseError) as refused:
            await c.chat(model=MODEL, messages=HELLO, format=schema, stream=False)
    assert fake.requests[0].body["response_format"] == {"type": "json_object"}
    assert fake.requests[1].body["response_format"]["json_schema"]["schema"] == schema
    assert refused.value.status_code == 400 and "unsupported" in refused.value.error


async def test_errors_in_ollamas_shape(fake: FakeUpstream) -> None:
    async with run_router(router_settings(fake)) as r, aiohttp.ClientSession() as s:
        with pytest.raises(ollama.ResponseError) as missing:
            await client(r.url).chat(model="no-such-model", messages=HELLO, stream=False)
        async with s.post(f"{r.url}/api/chat", data=b"{not json") as resp:
            bad = (resp.status, await resp.json())
        async with s.get(f"{r.url}/api/nothing-here") as resp:
            unknown = (resp.status, await resp.json())
    assert missing.value.status_code == 404 and "no-such-model" in missing.value.error
    assert bad[0] == 400 and isinstance(bad[1]["error"], str)
    assert unknown[0] == 404 and set(unknown[1]) == {"error"}


async def test_error_mid_stream_is_an_ndjson_error_line() -> None:
    async with (
        fake_upstream(behaviour=Behaviour(die_after=2)) as fake,
        run_router(router_settings(fake, retry={"attempts": 1})) as r,
    ):
        got = []
        with pytest.raises(ollama.ResponseError) as failed:
            async for part in await client(r.url).chat(model=MODEL, messages=HELLO, stream=True):
                got.append(part.message.content)
    assert got == ["w0 ", "w1 "]
    assert "closed the stream" in failed.value.error


async def test_policies_apply(fake: FakeUpstream, tmp_path: Path) -> None:
    (tmp_path / "default.toml").write_text(
        'require_api_key = true\n[match]\napi_keys = ["house-key"]\n'
    )
    (tmp_path / "narrow.toml").write_text(
        'require_api_key = true\n[match]\napi_keys = ["narrow-key"]\n'
        '[models]\nallow = ["other-*"]\n'
    )
    async with run_router(router_settings(fake, policies_dir=str(tmp_path))) as r:
        with pytest.raises(ollama.ResponseError) as anonymous:
            await client(r.url).chat(model=MODEL, messages=HELLO, stream=False)
        with pytest.raises(ollama.ResponseError) as narrow:
            await client(r.url, Authorization="Bearer narrow-key").chat(
                model=MODEL, messages=HELLO, stream=False
            )
        with pytest.raises(ollama.ResponseError) as listing:
            await client(r.url).list()
        ok = await client(r.url, Authorization="Bearer house-key").chat(
            model=MODEL, messages=HELLO, stream=False
        )
    assert anonymous.value.status_code == 401 and listing.value.status_code == 401
    assert narrow.value.status_code == 403
    assert ok.message.content


async def test_model_endpoints(fake: FakeUpstream) -> None:
    async with run_router(router_settings(fake)) as r:
        c = client(r.url)
        listed = await c.list()
        shown = await c.show(MODEL)
        running = await c.ps()
        with pytest.raises(ollama.ResponseError) as missing:
            await c.show("no-such-model")
        async with aiohttp.ClientSession() as s, s.get(f"{r.url}/api/version") as resp:
            version = await resp.json()
    assert [m.model for m in listed.models] == [MODEL]
    assert "tools" in (shown.capabilities or [])
    assert [m.model for m in running.models] == [MODEL]
    assert missing.value.status_code == 404
    assert version["version"].count(".") == 2
