"""The Responses door's other endpoints through the official openai SDK:
``GET /v1/responses/{id}/input_items``, ``POST /v1/responses/{id}/cancel``,
``POST /v1/responses/input_tokens``, and background responses; against loopback fake
upstreams and a lane that is the real worker's HTTP side around a scripted engine."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import aiohttp
import openai
import orjson
import pytest
from aiohttp import web

from router.frontdoors.tokencount import MAX_COUNT_ANSWER
from tests.conftest import RunningRouter, router_settings, run_router, wait_until
from tests.fakes.upstream import Behaviour, FakeUpstream, fake_upstream
from tests.frontdoors.test_handlers import MODEL as LANE_MODEL
from tests.frontdoors.test_handlers import scripted_router
from tests.worker.scripted import ScriptedEngine

MODEL = "fake-model"
WAIT = 10.0
POLICIES = {
    "alice.toml": 'require_api_key = true\n[match]\napi_keys = ["alice-key"]\n',
    "bob.toml": 'require_api_key = true\n[match]\napi_keys = ["bob-key"]\n',
}
INPUT: list[Any] = [
    {"role": "user", "content": "one"},
    {"type": "message", "role": "assistant", "content": "two"},
    {"id": "msg_mine", "role": "user", "content": [{"type": "input_text", "text": "three"}]},
]
TOOLS: list[Any] = [
    {
        "type": "function",
        "name": "get_weather",
        "description": "Weather in a city",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
    }
]


def two_clients(tmp_path: Path) -> str:
    for name, text in POLICIES.items():
        (tmp_path / name).write_text(text)
    return str(tmp_path)


# --- input_items ------------------------------------------------------------------------------


async def test_input_items_are_listed_and_paged_as_openai_does(fake: FakeUpstream) -> None:
    async with run_router(router_settings(fake)) as r:
        client = r.client()
        made = await client.responses.create(model=MODEL, instructions="Be brief.", input=INPUT)
        first = await client.responses.input_items.list(made.id)
        asc = await client.responses.input_items.list(made.id, order="asc", limit=2)
        walked = [item.id async for item in client.responses.input_items.list(made.id, limit=1)]
        raw = await client.responses.input_items.with_raw_response.list(
            made.id, order="asc", after=asc.data[0].id, extra_query={"before": "msg_mine"}
        )
        page = orjson.loads(raw.content)
        single = await client.responses.create(model=MODEL, input="just text")
        only = await client.responses.input_items.list(single.id)
    # newest first by default; instructions are not input items
    assert [i.role for i in first.data] == ["user", "assistant", "user"]  # type: ignore[union-attr]
    assert first.data[0].id == "msg_mine" and all(i.id for i in first.data)
    assert first.data[1].content[0].type == "output_text"  # type: ignore[union-attr]
    assert first.data[2].content[0].text == "one"  # type: ignore[union-attr]
    assert first.data[2].content[0].type == "input_text"  # type: ignore[union-attr]
    assert first.has_more is False and first.first_id == "msg_mine"
    assert [i.id for i in asc.data] == [first.data[2].id, first.data[1].id] and asc.has_more
    assert walked == [i.id for i in first.data]  # the SDK's pages follow last_id
    assert page["object"] == "list" and [i["id"] for i in page["data"]] == [first.data[1].id]
    assert (page["first_id"], page["last_id"], page["has_more"]) == (
        first.data[1].id,
        first.data[1].id,
        False,
    )
    assert [i.content[0].text for i in only.data] == ["just text"]  # type: ignore[union-attr]


async def test_input_items_refusals(fake: FakeUpstream, tmp_path: Path) -> None:
    async with run_router(router_settings(fake, policies_dir=two_clients(tmp_path))) as r:
        alice, bob = r.client(api_key="alice-key"), r.client(api_key="bob-key")
        made = await alice.responses.create(model=MODEL, input="Hi")
        unstored = await alice.responses.create(model=MODEL, input="Hi", store=False)
        with pytest.raises(openai.NotFoundError) as foreign:
            await bob.responses.input_items.list(made.id)
        with pytest.raises(openai.NotFoundError):
            await alice.responses.input_items.list(unstored.id)
        with pytest.raises(openai.BadRequestError) as limit:
            await alice.responses.input_items.list(made.id, limit=101)
        # Unicode digits (str.isdigit() takes them, int() does not), 5,000 digits: a 400
        # naming the parameter, never a 500 with a traceback
        for bad in ("\u00b2", "\u00b3\u00b9", "\u2460", "\u0663", "9" * 5000, "-1", " 5"):
            with pytest.raises(openai.BadRequestError) as strict:
                await alice.responses.input_items.list(made.id, extra_query={"limit": bad})
            assert strict.value.body["param"] == "limit", bad  # type: ignore[index]
        with pytest.raises(openai.BadRequestError) as order:
            await alice.responses.input_items.list(made.id, extra_query={"order": "up"})
        with pytest.raises(openai.BadRequestError) as cursor:
            await alice.responses.input_items.list(made.id, after="msg_nowhere")
    assert foreign.value.body["code"] == "response_not_found"  # type: ignore[index]
    assert limit.value.body["param"] == "limit"  # type: ignore[index]
    assert order.value.body["param"] == "order"  # type: ignore[index]
    assert cursor.value.body["param"] == "after"  # type: ignore[index]


# --- cancel ----------------------------------------------------------------------------------


async def stream_until_text(r: RunningRouter, body: dict[str, Any]) -> tuple[Any, Any, str]:
    """Open a Responses stream and read up to its first text delta; (session, response, id)."""
    session = aiohttp.ClientSession()
    resp = await session.post(f"{r.url}/v1/responses", json={**body, "stream": True})
    resp_id = ""
    while True:
        line = await asyncio.wait_for(resp.content.readline(), WAIT)
        assert line, "the stream ended before its first text"
        if line.startswith(b"data: "):
            event = orjson.loads(line[6:])
            resp_id = resp_id or event["response"]["id"]
            if event["type"] == "response.output_text.delta":
                return session, resp, resp_id


def events_in(text: bytes) -> list[dict[str, Any]]:
    return [orjson.loads(line[6:]) for line in text.split(b"\n") if line.startswith(b"data: ")]


async def test_cancel_stops_a_stream_and_frees_the_lanes_slot(tmp_path: Path) -> None:
    engine = ScriptedEngine("a long answer", paced=True)
    async with scripted_router(engine, tmp_path) as r:
        client = r.client()
        engine.release(1)
        session, resp, resp_id = await stream_until_text(
            r, {"model": LANE_MODEL, "input": "hello", "max_output_tokens": 64}
        )
        cancelled = await client.responses.cancel(resp_id)
        rest = await asyncio.wait_for(resp.content.read(), WAIT)
        await session.close()
        assert await asyncio.to_thread(engine.cancels.acquire, True, WAIT)  # the lane let go
        again = await client.responses.cancel(resp_id)
        stored = await client.responses.retrieve(resp_id)
        # the lane takes the next request: its one slot is free
        engine.release(100)
        after = await client.responses.create(model=LANE_MODEL, input="again", max_output_tokens=64)
        with pytest.raises(openai.BadRequestError) as finished:
            await client.responses.cancel(after.id)
        with pytest.raises(openai.NotFoundError):
            await client.responses.cancel("resp_nowhere")
    assert cancelled.status == "cancelled" and cancelled.id == resp_id
    assert cancelled.output_text == "a"  # what was written before the cancel
    last = events_in(rest)[-1]
    assert last["type"] == "response.cancelled" and last["response"]["status"] == "cancelled"
    assert again.status == "cancelled" and stored.status == "cancelled"
    assert after.status == "completed"
    assert finished.value.body["code"] == "response_not_cancellable"  # type: ignore[index]
    assert "completed" in finished.value.message


async def test_another_client_cannot_cancel(tmp_path: Path) -> None:
    async with (
        fake_upstream(behaviour=Behaviour(chunks=50, interval=0.2)) as fake,
        run_router(router_settings(fake, policies_dir=two_clients(tmp_path))) as r,
    ):
        session = aiohttp.ClientSession(headers={"Authorization": "Bearer alice-key"})
        resp = await session.post(
            f"{r.url}/v1/responses", json={"model": MODEL, "input": "Hi", "stream": True}
        )
        line = b""
        while not line.startswith(b"data: "):
            line = await asyncio.wait_for(resp.content.readline(), WAIT)
        resp_id = orjson.loads(line[6:])["response"]["id"]
        with pytest.raises(openai.NotFoundError):
            await r.client(api_key="bob-key").responses.cancel(resp_id)
        assert not fake.cancelled
        await r.client(api_key="alice-key").responses.cancel(resp_id)
        await asyncio.wait_for(fake.request_cancelled.wait(), WAIT)  # upstream closed
        await session.close()


# --- background ------------------------------------------------------------------------------


async def test_background_response_runs_and_is_stored(fake: FakeUpstream) -> None:
    fake.then(Behaviour(delay_headers=0.3))
    async with run_router(router_settings(fake)) as r:
        client = r.client()
        queued = await client.responses.create(model=MODEL, input=INPUT, background=True)
        store = r.services.responses
        await wait_until(
            lambda: store.get("label:default", queued.id).response["status"] == "completed"
        )  # type: ignore[union-attr]
        done = await client.responses.retrieve(queued.id)
        items = await client.responses.input_items.list(queued.id)
        follow = await client.responses.create(
            model=MODEL, input="and then?", previous_response_id=queued.id
        )
        with pytest.raises(openai.BadRequestError):
            await client.responses.cancel(queued.id)
    assert queued.status == "queued" and queued.background is True and not queued.output
    assert done.status == "completed" and done.output_text == "w0 w1 w2 w3 w4"
    assert done.background is True and len(items.data) == 3
    assert follow.status == "completed"
    assert fake.requests[1].body["messages"][-2] == {
        "role": "assistant",
        "content": "w0 w1 w2 w3 w4",
    }


async def test_cancel_stops_a_background_response(tmp_path: Path) -> None:
    engine = ScriptedEngine("a long answer", paced=True)
    async with scripted_router(engine, tmp_path) as r:
        client = r.client()
        queued = await client.responses.create(model=LANE_MODEL, input="hello", background=True)
        await wait_until(lambda: engine.started, WAIT)  # running on the lane
        cancelled = await client.responses.cancel(queued.id)
        assert await asyncio.to_thread(engine.cancels.acquire, True, WAIT)
        stored = await client.responses.retrieve(queued.id)
        engine.release(100)
        after = await client.responses.create(model=LANE_MODEL, input="again", max_output_tokens=64)
    assert cancelled.status == "cancelled" and stored.status == "cancelled"
    assert after.status == "completed"


async def test_background_refusals_and_bound(fake: FakeUpstream) -> None:
    fake.behaviour = Behaviour(delay_headers=WAIT)  # each one holds its place
    settings = router_settings(fake, responses={"max_background": 1})
    async with run_router(settings) as r:
        client = r.client()
        with pytest.raises(openai.BadRequestError) as unstored:
            await client.responses.create(model=MODEL, input="x", background=True, store=False)
        with pytest.raises(openai.BadRequestError) as streamed:
            await client.responses.create(model=MODEL, input="x", background=True, stream=True)
        with pytest.raises(openai.BadRequestError) as invalid:
            await client.responses.create(
                model=MODEL,
                input="x",
                background=True,
                tools=[{"type": "code_interpreter", "container": {"type": "auto"}}],  # type: ignore[list-item]
            )
        first = await client.responses.create(model=MODEL, input="x", background=True)
        with pytest.raises(openai.RateLimitError) as bound:
            await client.responses.create(model=MODEL, input="y", background=True)
        await client.responses.cancel(first.id)
        await asyncio.wait_for(fake.request_cancelled.wait(), WAIT)
    assert unstored.value.body["param"] == "store"  # type: ignore[index]
    assert streamed.value.body["code"] == "unsupported_parameter"  # type: ignore[index]
    assert invalid.value.body["param"] == "tools[0]"  # type: ignore[index]
    assert bound.value.body["code"] == "too_many_background_responses"  # type: ignore[index]
    assert len(fake.requests) == 1


# --- input_tokens ----------------------------------------------------------------------------


async def test_input_tokens_count_as_the_lane_renders_the_request(tmp_path: Path) -> None:
    engine = ScriptedEngine("ok")
    async with scripted_router(engine, tmp_path) as r:
        client = r.client()
        plain = await client.responses.input_tokens.count(
            model=LANE_MODEL, instructions="Be brief.", input="hello"
        )
        tooled = await client.responses.input_tokens.count(
            model=LANE_MODEL, instructions="Be brief.", input="hello", tools=TOOLS
        )
        no_model = await client.responses.input_tokens.count(input="hello")
        made = await client.responses.create(model=LANE_MODEL, input="hello", max_output_tokens=2)
        chained = await client.responses.input_tokens.count(
            model=LANE_MODEL, input="more", previous_response_id=made.id
        )
        with pytest.raises(openai.NotFoundError):
            await client.responses.input_tokens.count(model="no-such-model", input="x")
        with pytest.raises(openai.BadRequestError):
            await client.responses.input_tokens.count(model=LANE_MODEL, input=[{"type": "x"}])  # type: ignore[list-item]
        async with aiohttp.ClientSession() as s:
            async with s.post(
                f"{r.url}/v1/responses/input_tokens", json={"model": LANE_MODEL, "input": "hi"}
            ) as resp:
                raw = await resp.json()
    # the scripted lane's tokenizer counts the characters of "<role>content" per message
    assert plain.input_tokens == len("<system>Be brief.<user>hello")
    assert tooled.input_tokens > plain.input_tokens  # the tools are in the prompt
    assert no_model.input_tokens == len("<user>hello")
    assert chained.input_tokens == len("<user>hello<assistant>ok<user>more")
    assert raw == {"object": "response.input_tokens", "input_tokens": len("<user>hi")}


@pytest.mark.parametrize("kind", ["vllm", "llamacpp", "openai"])
async def test_input_tokens_in_front_of_an_external_backend(kind: str, fake: FakeUpstream) -> None:
    """No lane: a vLLM or llama.cpp backend counts under its own template (here its fake's,
    a character a token); a kind that cannot count gets an estimate that says so."""
    backends = [{"name": "ext", "kind": kind, "base_url": fake.base_url}]
    async with run_router(router_settings(backends=backends)) as r:
        client = r.client()
        counted = await client.responses.input_tokens.count(
            model=MODEL, instructions="Be brief.", input="hello", tools=TOOLS
        )
        with pytest.raises(openai.BadRequestError) as unnamed:
            await client.responses.input_tokens.count(input="hello")
        with pytest.raises(openai.NotFoundError):
            await client.responses.input_tokens.count(model="no-such-model", input="x")
    extra = counted.model_extra or {}
    if kind == "openai":
        assert extra == {"estimated": True}
        assert 0 < counted.input_tokens < len("Be brief.hello") + 200
        assert not [s for s in fake.requests if s.path in ("/tokenize", "/apply-template")]
        return
    assert "estimated" not in extra
    seen = [s for s in fake.requests if s.path in ("/tokenize", "/apply-template")]
    rendered = seen[0].body
    assert [m["role"] for m in rendered["messages"]] == ["system", "user"]
    assert rendered["tools"][0]["function"]["name"] == "get_weather"
    tools = orjson.dumps(rendered["tools"]).decode()
    assert counted.input_tokens == len("<system>Be brief.<user>hello" + tools)
    assert [s.path for s in seen] == (
        ["/tokenize"] if kind == "vllm" else ["/apply-template", "/tokenize"]
    )
    assert unnamed.value.body["param"] == "model"  # type: ignore[index]


class EndlessCounter(FakeUpstream):
    """A vLLM-kind backend whose /tokenize answer never ends short of the bound."""

    async def _tokenize(self, request: web.Request) -> web.Response:
        await request.read()
        return web.Response(body=b"[" + b"1," * (MAX_COUNT_ANSWER // 2 + 8) + b"1]")


async def test_a_counting_answer_past_the_bound_is_the_upstreams_error_not_a_read_of_it() -> None:
    fake = EndlessCounter(name="ext")
    await fake.start()
    try:
        backends = [{"name": "ext", "kind": "vllm", "base_url": fake.base_url}]
        async with run_router(router_settings(backends=backends)) as r:
            with pytest.raises(openai.APIStatusError) as info:
                await r.client().responses.input_tokens.count(model=MODEL, input="hello")
    finally:
        await fake.stop()
    assert info.value.status_code == 502
    assert "more than" in info.value.message
    assert info.value.response.headers["x-speclane-error-source"] == "upstream"
