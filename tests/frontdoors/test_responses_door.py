"""POST /v1/responses (and GET/DELETE) through the official openai SDK, against loopback
fake upstreams."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import aiohttp
import ollama
import openai
import orjson
import pytest

from tests.conftest import lanes_router, metric_value, router_settings, run_router
from tests.fakes.upstream import Behaviour, FakeUpstream, fake_upstream
from tests.frontdoors.conftest import TOOL_ARGS, tool_call_body, tool_call_stream

MODEL = "fake-model"
TOOLS: list[Any] = [
    {
        "type": "function",
        "name": "get_weather",
        "description": "Weather in a city",
        "strict": False,
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string"}, "days": {"type": "integer"}},
        },
    }
]


async def test_text_on_the_lane_the_header_asks_for() -> None:
    async with (
        fake_upstream(name="spec") as spec,
        fake_upstream(name="batch") as batch,
        lanes_router(spec, batch) as r,
    ):
        client = r.client()
        raw = await client.responses.with_raw_response.create(
            model=MODEL,
            instructions="Be brief.",
            input="Hello",
            max_output_tokens=16,
            temperature=0.5,
            metadata={"run": "1"},
            reasoning={"effort": "low"},
            prompt_cache_key="conv-7",
            extra_headers={"X-Speclane-Lane": "batching"},
        )
        response = raw.parse()
        async with aiohttp.ClientSession() as s, s.get(f"{r.url}/metrics") as resp:
            metrics = await resp.text()
    assert raw.headers["x-speclane-lane"] == "batching" and raw.headers["x-speclane-decision"]
    assert not spec.requests and len(batch.requests) == 1
    sent = batch.requests[0].body
    assert sent["messages"] == [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Hello"},
    ]
    assert (sent["max_tokens"], sent["temperature"], sent["prompt_cache_key"]) == (
        16,
        0.5,
        "conv-7",
    )
    assert response.output_text == "w0 w1 w2 w3 w4" and response.status == "completed"
    assert response.id.startswith("resp_") and response.metadata == {"run": "1"}
    assert response.usage is not None and response.usage.output_tokens == 5
    assert metric_value(metrics, "speclane_requests_total", api="responses", status="200") == 1


async def test_stream_has_the_documented_event_sequence(fake: FakeUpstream) -> None:
    async with run_router(router_settings(fake)) as r:
        async with r.client().responses.stream(model=MODEL, input="Hello") as stream:
            events = [event async for event in stream]
            final = await stream.get_final_response()
    kinds = [e.type for e in events]
    assert kinds[:4] == [
        "response.created",
        "response.in_progress",
        "response.output_item.added",
        "response.content_part.added",
    ]
    assert kinds.count("response.output_text.delta") == 5
    assert kinds[-4:] == [
        "response.output_text.done",
        "response.content_part.done",
        "response.output_item.done",
        "response.completed",
    ]
    assert [e.sequence_number for e in events] == list(range(len(events)))
    assert fake.requests[0].body["stream_options"] == {"include_usage": True}
    assert final.output_text == "w0 w1 w2 w3 w4 " and final.usage is not None
    assert final.usage.input_tokens == 7 and final.usage.output_tokens == 5


@pytest.mark.parametrize("stream", [False, True], ids=["json", "stream"])
async def test_function_call_round_trip(fake: FakeUpstream, stream: bool) -> None:
    """The model calls a function; the client answers it once through previous_response_id
    and once with the whole conversation as input: the upstream sees the same messages."""
    fake.then(tool_call_stream() if stream else tool_call_body(), Behaviour(), Behaviour())
    async with run_router(router_settings(fake)) as r:
        client = r.client()
        ask = [{"role": "user", "content": "Weather in Paris?"}]
        if stream:
            async with client.responses.stream(
                model=MODEL,
                input=ask,  # type: ignore[arg-type]
                tools=TOOLS,
                tool_choice="required",
            ) as s:
                first = await s.get_final_response()
        else:
            first = await client.responses.create(
                model=MODEL,
                input=ask,  # type: ignore[arg-type]
                tools=TOOLS,
                tool_choice="required",
            )
        call = next(o for o in first.output if o.type == "function_call")
        assert (call.name, orjson.loads(call.arguments)) == ("get_weather", TOOL_ARGS)
        result = {"type": "function_call_output", "call_id": call.call_id, "output": "sunny"}
        chained = await client.responses.create(
            model=MODEL,
            previous_response_id=first.id,
            input=[result],  # type: ignore[list-item]
            tools=TOOLS,
        )
        whole = await client.responses.create(
            model=MODEL,
            tools=TOOLS,
            input=[
                *ask,
                *[o.model_dump(exclude_none=True) for o in first.output],  # type: ignore[list-item]
                result,
            ],
        )
    assert fake.requests[0].body["tool_choice"] == "required"
    assert fake.requests[0].body["tools"][0]["function"]["name"] == "get_weather"
    follow = fake.requests[1].body["messages"]
    assert follow == fake.requests[2].body["messages"]
    assert follow[0] == {"role": "user", "content": "Weather in Paris?"}
    assert follow[1]["tool_calls"][0]["id"] == call.call_id
    assert follow[-1] == {"role": "tool", "tool_call_id": call.call_id, "content": "sunny"}
    assert chained.previous_response_id == first.id
    assert chained.output_text == whole.output_text == "w0 w1 w2 w3 w4"


POLICIES = {
    "alice.toml": 'require_api_key = true\n[match]\napi_keys = ["alice-key"]\n',
    "bob.toml": 'require_api_key = true\n[match]\napi_keys = ["bob-key"]\n',
}


async def test_stored_responses_belong_to_their_client(fake: FakeUpstream, tmp_path: Path) -> None:
    for name, text in POLICIES.items():
        (tmp_path / name).write_text(text)
    async with run_router(router_settings(fake, policies_dir=str(tmp_path))) as r:
        alice, bob = r.client(api_key="alice-key"), r.client(api_key="bob-key")
        made = await alice.responses.create(model=MODEL, input="Hi")
        unstored = await alice.responses.create(model=MODEL, input="Hi", store=False)
        got = await alice.responses.retrieve(made.id)
        with pytest.raises(openai.NotFoundError):
            await bob.responses.retrieve(made.id)
        with pytest.raises(openai.NotFoundError) as foreign:
            await bob.responses.create(model=MODEL, input="x", previous_response_id=made.id)
        with pytest.raises(openai.NotFoundError):
            await bob.responses.delete(made.id)
        with pytest.raises(openai.NotFoundError):
            await alice.responses.retrieve(unstored.id)
        await alice.responses.delete(made.id)
        with pytest.raises(openai.NotFoundError):
            await alice.responses.retrieve(made.id)
    assert got.id == made.id and got.output_text == made.output_text
    assert foreign.value.body["code"] == "response_not_found"  # type: ignore[index]
    assert len(fake.requests) == 2  # bob's follow-up never reached the upstream


async def test_refusals_in_openais_shape(fake: FakeUpstream) -> None:
    async with run_router(router_settings(fake)) as r:
        client = r.client()
        with pytest.raises(openai.BadRequestError) as hosted:
            await client.responses.create(
                model=MODEL,
                input="x",
                tools=[
                    {
                        "type": "code_interpreter",  # type: ignore[list-item]
                        "container": {"type": "auto"},
                    }
                ],
            )
        with pytest.raises(openai.BadRequestError) as background:
            await client.responses.create(model=MODEL, input="x", background=True, stream=True)
        with pytest.raises(openai.NotFoundError):
            await client.responses.create(model="no-such-model", input="x")
    assert hosted.value.body["param"] == "tools[0]"  # type: ignore[index]
    assert "code_interpreter" in hosted.value.message
    assert background.value.body["code"] == "unsupported_parameter"  # type: ignore[index]
    assert not fake.requests


async def events_of(r: Any, body: dict[str, Any]) -> list[dict[str, Any]]:
    async with aiohttp.ClientSession() as s:
        async with s.post(f"{r.url}/v1/responses", json=body) as resp:
            assert resp.headers["Content-Type"].startswith("text/event-stream")
            text = await resp.read()
    return [orjson.loads(line[6:]) for line in text.split(b"\n") if line.startswith(b"data: ")]


@pytest.mark.parametrize(
    "behaviour", [Behaviour(die_after=2), Behaviour(no_done=True)], ids=["upstream-died", "no-done"]
)
async def test_stream_that_fails_midway_ends_with_response_failed(behaviour: Behaviour) -> None:
    async with (
        fake_upstream(behaviour=behaviour) as fake,
        run_router(router_settings(fake, retry={"attempts": 1})) as r,
    ):
        events = await events_of(r, {"model": MODEL, "input": "Hi", "stream": True})
    assert events[0]["type"] == "response.created"
    assert events[-1]["type"] == "response.failed"
    assert events[-1]["response"]["status"] == "failed"
    assert events[-1]["response"]["error"]["code"] == "server_error"
    assert [e["sequence_number"] for e in events] == list(range(len(events)))
    assert not any(e["type"] == "response.completed" for e in events)


async def test_upstream_error_event_ends_with_response_failed() -> None:
    error = b'data: {"error": {"message": "context too long", "code": 400}}\n\n'
    start = b'data: {"choices": [{"index": 0, "delta": {"content": "a"}}]}\n\n'
    async with (
        fake_upstream(behaviour=Behaviour(raw_body=start + error)) as fake,
        run_router(router_settings(fake)) as r,
    ):
        events = await events_of(r, {"model": MODEL, "input": "Hi", "stream": True})
    assert events[-1]["type"] == "response.failed"
    assert events[-1]["response"]["error"]["code"] == "invalid_prompt"
    assert "context too long" in events[-1]["response"]["error"]["message"]


async def test_ollama_door_answers_what_codex_oss_asks(fake: FakeUpstream) -> None:
    """``codex --oss`` reads /api/version (it requires 0.13.4 or newer, the first Ollama with
    a /v1/responses it accepts) and pulls its model when the model list lacks it."""
    async with run_router(router_settings(fake)) as r:
        client = ollama.AsyncClient(host=r.url)
        pulled = await client.pull(MODEL)
        streamed = [p async for p in await client.pull(MODEL, stream=True)]
        with pytest.raises(ollama.ResponseError) as missing:
            await client.pull("gpt-oss:20b")
        with pytest.raises(ollama.ResponseError) as missing_stream:
            async for _ in await client.pull("gpt-oss:20b", stream=True):
                pass
        async with aiohttp.ClientSession() as s, s.get(f"{r.url}/api/version") as resp:
            version = (await resp.json())["version"]
    assert pulled.status == "success" and streamed[-1].status == "success"
    assert "does not download models" in missing.value.error
    assert "served: fake-model" in missing_stream.value.error
    assert tuple(int(x) for x in version.split(".")) >= (0, 13, 4)


async def test_prompt_cache_key_steers_to_the_lane_that_served_it() -> None:
    """Without a known prefix, the key's last lane is the cache holder (cache affinity)."""
    async with (
        fake_upstream(name="spec") as spec,
        fake_upstream(name="batch") as batch,
        lanes_router(spec, batch) as r,
    ):
        client = r.client()
        await client.responses.create(
            model=MODEL,
            input="First conversation.",
            prompt_cache_key="session-1",
            extra_headers={"X-Speclane-Lane": "batching"},
        )
        keyed = await client.responses.with_raw_response.create(
            model=MODEL, input="Rewritten history.", prompt_cache_key="session-1"
        )
        other = await client.responses.with_raw_response.create(
            model=MODEL, input="Another conversation.", prompt_cache_key="session-2"
        )
    assert keyed.headers["x-speclane-lane"] == "batching"
    assert "cache-affinity" in keyed.headers["x-speclane-decision"]
    assert other.headers["x-speclane-lane"] == "speculative"


async def test_store_bounds_come_from_the_configuration(fake: FakeUpstream) -> None:
    async with run_router(router_settings(fake, responses={"store_entries": 1})) as r:
        client = r.client()
        older = await client.responses.create(model=MODEL, input="one")
        newer = await client.responses.create(model=MODEL, input="two")
        assert (await client.responses.retrieve(newer.id)).id == newer.id
        with pytest.raises(openai.NotFoundError):
            await client.responses.retrieve(older.id)  # evicted: one response is kept
