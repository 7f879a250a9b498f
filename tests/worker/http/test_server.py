"""The worker's HTTP side against a scripted engine: shapes, errors, streaming, disconnects."""

from __future__ import annotations

import asyncio
import dataclasses
import threading
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import aiohttp
import openai
import orjson
import pytest

from router.kernel.worker_contract import STREAM_USAGE_FIELD, WORKER_SECRET_HEADER
from router.worker.http import server as server_module
from router.worker.http.server import WorkerInfo, make_worker_app, start_site
from router.worker.request.protocol import GenerationRequest
from tests.worker.scripted import ScriptedEngine

MODEL = "scripted-model"
WAIT = 10.0


@asynccontextmanager
async def serving(engine: ScriptedEngine, context_length: int | None = None) -> AsyncIterator[str]:
    engine.start()
    info = WorkerInfo(
        mode="speculative",
        model_name=MODEL,
        draft_name=None,
        num_draft_tokens=0,
        context_length=context_length,
    )
    runner, port = await start_site(make_worker_app(engine, info), "127.0.0.1", 0)
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        while _open_clients:
            await _open_clients.pop().close()
        await asyncio.to_thread(engine.stop, 2.0)
        await runner.cleanup()


# Clients made inside a `serving` block, closed when it ends (an AsyncOpenAI left to the GC
# closes itself later on whatever event loop is running then: errors in another test's log).
_open_clients: list[openai.AsyncOpenAI] = []


def client(url: str) -> openai.AsyncOpenAI:
    made = openai.AsyncOpenAI(base_url=f"{url}/v1", api_key="x", max_retries=0, timeout=WAIT)
    _open_clients.append(made)
    return made


async def waited(event: threading.Event | threading.Semaphore) -> bool:
    """Wait (off the loop) for something the generation thread signals."""
    if isinstance(event, threading.Event):
        return await asyncio.to_thread(event.wait, WAIT)
    return await asyncio.to_thread(event.acquire, timeout=WAIT)


async def health(session: aiohttp.ClientSession, url: str) -> dict[str, object]:
    async with session.get(f"{url}/health") as r:
        return await r.json()


async def test_chat_answer_shape_and_usage() -> None:
    async with serving(ScriptedEngine("Hello")) as url:
        reply = await client(url).chat.completions.create(
            model=MODEL, messages=[{"role": "user", "content": "hi"}], max_tokens=50
        )
    assert reply.choices[0].message.content == "Hello"
    assert reply.choices[0].finish_reason == "stop"
    assert reply.usage is not None
    assert reply.usage.completion_tokens == 5
    assert reply.usage.prompt_tokens == len("<user>hi")
    assert reply.usage.model_extra["speclane_spec"]["num_draft_tokens"] == 0


async def test_draft_model_on_a_lane_without_one_is_a_400_naming_draft_source() -> None:
    async with serving(ScriptedEngine("Hello")) as url:
        ask = client(url).chat.completions.create
        with pytest.raises(openai.BadRequestError) as info:
            await ask(
                model=MODEL,
                messages=[{"role": "user", "content": "hi"}],
                extra_body={"draft_source": "draft_model"},
            )
        # prompt_lookup needs no draft model: served
        reply = await ask(
            model=MODEL,
            messages=[{"role": "user", "content": "hi"}],
            extra_body={"draft_source": "prompt_lookup"},
        )
    body = info.value.body
    assert isinstance(body, dict) and body["param"] == "draft_source"
    assert "no draft model" in body["message"]
    assert reply.choices[0].message.content == "Hello"


async def test_text_completion_length_and_stop() -> None:
    async with serving(ScriptedEngine("one two three")) as url:
        c = client(url)
        cut = await c.completions.create(model=MODEL, prompt="x", max_tokens=3)
        stopped = await c.completions.create(model=MODEL, prompt="x", stop=[" t"])
    assert (cut.choices[0].text, cut.choices[0].finish_reason) == ("one", "length")
    assert (stopped.choices[0].text, stopped.choices[0].finish_reason) == ("one", "stop")


@pytest.mark.parametrize("include_usage", [True, False])
async def test_stream_carries_usage_once_on_the_last_chunk(include_usage: bool) -> None:
    async with serving(ScriptedEngine("abc")) as url:
        stream = await client(url).chat.completions.create(
            model=MODEL,
            messages=[{"role": "user", "content": "hi"}],
            stream=True,
            stream_options={"include_usage": True} if include_usage else None,
        )
        chunks = [chunk async for chunk in stream]
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == "abc"
    assert chunks[0].choices[0].delta.role == "assistant"
    finish = [c for c in chunks if c.choices and c.choices[0].finish_reason]
    assert len(finish) == 1
    assert finish[0].choices[0].finish_reason == "stop"
    # Clients that add usage up must see it once, on the last chunk, and only when asked
    # (OpenAI sends none otherwise); the router still finds the lane's figures on the finish
    # chunk, under a field of ours.
    with_usage = [c for c in chunks if c.usage is not None]
    if include_usage:
        assert with_usage == [chunks[-1]] and chunks[-1].choices == []
        assert chunks[-1].usage is not None
        assert chunks[-1].usage.total_tokens == 3 + len("<user>hi")
        assert not any(STREAM_USAGE_FIELD in (c.model_extra or {}) for c in chunks)
    else:
        assert with_usage == [] and chunks[-1] is finish[0]
        ours = (finish[0].model_extra or {})[STREAM_USAGE_FIELD]
        assert ours["total_tokens"] == 3 + len("<user>hi") and "speclane_spec" in ours


async def test_continuous_usage_gives_the_prompts_size_first() -> None:
    async with serving(ScriptedEngine("abc")) as url:
        stream = await client(url).chat.completions.create(
            model=MODEL,
            messages=[{"role": "user", "content": "hi"}],
            stream=True,
            stream_options={"include_usage": True, "continuous_usage_stats": True},
        )
        chunks = [chunk async for chunk in stream]
    prompt = len("<user>hi")
    assert chunks[0].usage is not None and chunks[0].choices[0].delta.role == "assistant"
    assert (chunks[0].usage.prompt_tokens, chunks[0].usage.completion_tokens) == (prompt, 0)
    assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens == 3


async def test_without_a_limit_an_answer_runs_to_the_end_of_the_context() -> None:
    reply = "x" * 600  # longer than the old default of 512 tokens
    prompt = len("<user>hi")
    async with serving(ScriptedEngine(reply), context_length=prompt + 550) as url:
        ask = client(url).chat.completions.create
        whole = await ask(model=MODEL, messages=[{"role": "user", "content": "hi"}])
        asked = await ask(
            model=MODEL, messages=[{"role": "user", "content": "hi"}], max_tokens=32000
        )
    for answer in (whole, asked):
        assert answer.usage is not None and answer.usage.completion_tokens == 550
        assert answer.choices[0].finish_reason == "length"


async def test_raw_stream_ends_with_done() -> None:
    async with serving(ScriptedEngine("ab")) as url, aiohttp.ClientSession() as session:
        body = {"prompt": "x", "stream": True}
        async with session.post(f"{url}/v1/completions", json=body) as r:
            assert r.headers["Content-Type"].startswith("text/event-stream")
            raw = await r.read()
    events = [e for e in raw.decode().split("\n\n") if e]
    assert events[-1] == "data: [DONE]"
    last = orjson.loads(events[-2].removeprefix("data: "))
    assert last["choices"][0]["finish_reason"] == "stop"
    assert "usage" not in last and last[STREAM_USAGE_FIELD]["speclane_spec"]["drafted"] == 0


@pytest.mark.parametrize(
    ("body", "status", "param"),
    [
        (b"{not json", 400, None),
        (b'{"messages": [], "model": "scripted-model"}', 400, "messages"),
        (b'{"messages": [{"role": "user", "content": "x"}], "max_tokens": -1}', 400, "max_tokens"),
        (b'{"messages": [{"role": "user", "content": "x"}], "model": "other"}', 404, "model"),
    ],
)
async def test_errors_use_the_openai_shape(body: bytes, status: int, param: str | None) -> None:
    async with serving(ScriptedEngine("x")) as url, aiohttp.ClientSession() as session:
        async with session.post(f"{url}/v1/chat/completions", data=body) as r:
            assert r.status == status
            assert r.headers["X-Speclane-Error-Source"] == "router"
            error = (await r.json())["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert error["param"] == param


async def test_models_and_health() -> None:
    async with serving(ScriptedEngine("x")) as url, aiohttp.ClientSession() as session:
        async with session.get(f"{url}/v1/models") as r:
            models = await r.json()
        state = await health(session, url)
    assert [m["id"] for m in models["data"]] == [MODEL]
    assert state["status"] == "ok"
    assert (state["active"], state["queued"], state["capacity"]) == (0, 0, 1)
    assert state["speculative"] is False


async def test_a_failure_after_the_first_token_ends_the_stream_with_an_error_event() -> None:
    engine = ScriptedEngine("abcdef")
    engine.fail_at = 2
    async with serving(engine) as url, aiohttp.ClientSession() as session:
        body = {"prompt": "x", "stream": True}
        async with session.post(f"{url}/v1/completions", json=body) as r:
            raw = (await r.read()).decode()
    assert '"type":"server_error"' in raw
    assert "scripted failure" not in raw  # the exception's text stays in the worker's log
    assert raw.endswith("data: [DONE]\n\n")


async def test_a_failure_before_the_first_token_is_a_plain_http_error() -> None:
    engine = ScriptedEngine("abc")
    engine.fail_at = 0
    async with serving(engine) as url, aiohttp.ClientSession() as session:
        body = {"prompt": "x", "stream": True}
        async with session.post(f"{url}/v1/completions", json=body) as r:
            assert r.status == 500
            error = (await r.json())["error"]
    assert error["type"] == "server_error" and error["code"] == "internal_error"
    assert "scripted failure" not in error["message"]
    assert "reference" in error["message"]


async def test_a_disconnected_stream_stops_generation_at_the_next_step() -> None:
    engine = ScriptedEngine("a" * 100, paced=True)
    async with serving(engine) as url, aiohttp.ClientSession() as session:
        body = {"prompt": "x", "stream": True, "max_tokens": 100}
        engine.release(1)  # headers go out with the first token
        response = await session.post(f"{url}/v1/completions", json=body)
        assert (await response.content.readline()).startswith(b"data: ")
        response.close()  # the client goes away mid-stream
        assert await waited(engine.started[0].cancelled)
        engine.release(5)  # the engine may take its next step now: it must not generate
        assert await waited(engine.job_done)
        assert (await health(session, url))["active"] == 0
        assert engine.steps_taken == 1


async def test_a_queued_request_that_disconnects_leaves_the_queue_at_once() -> None:
    engine = ScriptedEngine("abc", paced=True)
    async with serving(engine) as url, aiohttp.ClientSession() as session:
        body = {"prompt": "x", "max_tokens": 3}
        first = asyncio.create_task(session.post(f"{url}/v1/completions", json=body))
        assert await waited(engine.job_started)
        second = asyncio.create_task(session.post(f"{url}/v1/completions", json=body))
        assert await waited(engine.submitted) and await waited(engine.submitted)
        state = await health(session, url)
        assert (state["active"], state["queued"]) == (1, 1)
        second.cancel()  # the waiting client gives up
        assert await waited(engine.cancels)
        assert (await health(session, url))["queued"] == 0
        engine.release(3)
        answer = await (await first).json()
        assert answer["choices"][0]["text"] == "abc"
        assert len(engine.started) == 1  # the cancelled request never reached the engine


WEATHER_TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
    },
}
CALLING = (
    'Checking.\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris, the '
    'capital of France, on the Seine"}}\n</tool_call>'
)


async def test_a_tool_call_answer() -> None:
    async with serving(ScriptedEngine(CALLING)) as url:
        reply = await client(url).chat.completions.create(
            model=MODEL, messages=[{"role": "user", "content": "weather?"}], tools=[WEATHER_TOOL]
        )
    choice = reply.choices[0]
    assert choice.finish_reason == "tool_calls"
    assert choice.message.content == "Checking."
    assert choice.message.tool_calls is not None
    (call,) = choice.message.tool_calls
    assert call.type == "function" and call.id.startswith("call_")
    assert call.function.name == "get_weather"
    assert orjson.loads(call.function.arguments) == {
        "city": "Paris, the capital of France, on the Seine"
    }


async def test_a_streamed_tool_call_comes_as_openai_streams_it() -> None:
    async with serving(ScriptedEngine(CALLING)) as url:
        stream = await client(url).chat.completions.create(
            model=MODEL,
            messages=[{"role": "user", "content": "weather?"}],
            tools=[WEATHER_TOOL],
            stream=True,
            stream_options={"include_usage": True},
        )
        chunks = [chunk async for chunk in stream]
    deltas = [d for c in chunks if c.choices for d in c.choices[0].delta.tool_calls or []]
    assert len(deltas) > 2  # id and name, then the arguments in fragments
    head, rest = deltas[0], deltas[1:]
    assert (head.index, head.type, head.function and head.function.name) == (
        0,
        "function",
        "get_weather",
    )
    assert head.id is not None and head.id.startswith("call_")
    assert all(d.index == 0 and d.id is None for d in rest)
    arguments = "".join(d.function.arguments or "" for d in deltas if d.function)
    assert orjson.loads(arguments) == {"city": "Paris, the capital of France, on the Seine"}
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == "Checking."
    finish = [
        c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason
    ]
    assert finish == ["tool_calls"]
    assert [c for c in chunks if c.usage is not None] == [chunks[-1]]


async def test_with_tool_choice_none_the_text_is_not_parsed() -> None:
    async with serving(ScriptedEngine(CALLING)) as url:
        reply = await client(url).chat.completions.create(
            model=MODEL,
            messages=[{"role": "user", "content": "weather?"}],
            tools=[WEATHER_TOOL],
            tool_choice="none",
        )
    assert reply.choices[0].message.content == CALLING
    assert reply.choices[0].message.tool_calls is None
    assert reply.choices[0].finish_reason == "stop"


async def test_tools_reach_the_prompt_through_the_fallback() -> None:
    engine = ScriptedEngine("ok")
    history = [
        {"role": "user", "content": "weather?"},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": "c1",
                    "type": "function",
                    "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'},
                }
            ],
        },
        {"role": "tool", "tool_call_id": "c1", "content": "sunny"},
    ]
    async with serving(engine) as url:
        await client(url).chat.completions.create(
            model=MODEL,
            messages=history,
            tools=[WEATHER_TOOL],  # type: ignore[arg-type]
        )
    prompt = "".join(chr(t) for t in engine.started[0].prompt_ids)
    assert prompt.startswith("<system># Tools")
    assert '"name": "get_weather"' in prompt
    assert (
        '<assistant><tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}' in prompt
    )
    assert prompt.endswith("<user><tool_response>\nsunny\n</tool_response>")


async def test_the_arguments_stream_while_the_call_is_written() -> None:
    engine = ScriptedEngine(CALLING, paced=True)
    cut = CALLING.index("capital")  # the model has written '{"city": "Paris, the ' so far
    async with serving(engine) as url:
        engine.release(cut)
        stream = await client(url).chat.completions.create(
            model=MODEL,
            messages=[{"role": "user", "content": "weather?"}],
            tools=[WEATHER_TOOL],
            stream=True,
        )
        chunks = aiter(stream)
        arguments, head, written = "", None, '{"city": "Paris, the '
        while len(arguments) < len(written):  # times out (the stream waits) if not streamed
            chunk = await anext(chunks)
            for d in chunk.choices[0].delta.tool_calls or [] if chunk.choices else []:
                head = head or d
                arguments += d.function.arguments or "" if d.function else ""
        assert engine.steps_taken == cut  # before the rest of the call was generated
        assert head is not None and head.function and head.function.name == "get_weather"
        assert arguments == written
        engine.release(len(CALLING) - cut)
        rest = [c async for c in chunks]
    for c in rest:
        for d in c.choices[0].delta.tool_calls or [] if c.choices else []:
            arguments += d.function.arguments or "" if d.function else ""
    assert orjson.loads(arguments) == {"city": "Paris, the capital of France, on the Seine"}
    assert rest[-1].choices[0].finish_reason == "tool_calls"


# Keys in the other order: the call is not streamed as written but sent whole at its end.
CALLING_WHOLE = (
    'Checking.\n<tool_call>\n{"arguments": {"city": "Paris, the capital of France, on the '
    'Seine"}, "name": "get_weather"}\n</tool_call>'
)


async def test_a_call_being_written_still_shows_progress(monkeypatch: pytest.MonkeyPatch) -> None:
    # Every held token may send an empty delta (the real interval is seconds).
    monkeypatch.setattr("router.worker.http.answers.PROGRESS_EVERY", 0.0)
    async with serving(ScriptedEngine(CALLING_WHOLE)) as url:
        stream = await client(url).chat.completions.create(
            model=MODEL,
            messages=[{"role": "user", "content": "weather?"}],
            tools=[WEATHER_TOOL],
            stream=True,
        )
        chunks = [chunk async for chunk in stream]
    empty = [
        c
        for c in chunks
        if c.choices
        and c.choices[0].delta.model_dump(exclude_none=True) == {}
        and c.choices[0].finish_reason is None
    ]
    assert len(empty) > 60  # one per token of the held call (not only its head), no content
    deltas = [d for c in chunks if c.choices for d in c.choices[0].delta.tool_calls or []]
    arguments = "".join(d.function.arguments or "" for d in deltas if d.function)
    assert orjson.loads(arguments) == {"city": "Paris, the capital of France, on the Seine"}


async def test_the_partition_header_reaches_the_job_and_a_malformed_one_is_a_400() -> None:
    from router.kernel.worker_contract import CACHE_PARTITION_HEADER

    engine = ScriptedEngine("ok")
    async with serving(engine) as url:
        ask = client(url).chat.completions.create
        messages = [{"role": "user", "content": "hi"}]
        await ask(model=MODEL, messages=messages, extra_headers={CACHE_PARTITION_HEADER: "a1"})
        await ask(model=MODEL, messages=messages)
        with pytest.raises(openai.BadRequestError) as info:
            await ask(
                model=MODEL,
                messages=messages,
                extra_headers={CACHE_PARTITION_HEADER: "not/a token"},
            )
    assert [job.partition for job in engine.started] == ["a1", ""]
    assert CACHE_PARTITION_HEADER in info.value.message


async def test_the_system_prompts_end_reaches_the_job_as_a_segment() -> None:
    """The prompt cache keeps an entry where the system part ends: its token position in the
    rendered prompt (the character template renders ``<role>content``)."""
    from router.worker.engines.promptcache import SYSTEM, Segment

    engine = ScriptedEngine("ok")
    system = "You are terse. " * 3
    async with serving(engine) as url:
        ask = client(url).chat.completions.create
        await ask(
            model=MODEL,
            messages=[{"role": "system", "content": system}, {"role": "user", "content": "hi"}],
        )
        await ask(model=MODEL, messages=[{"role": "user", "content": "hi"}])
    with_system, without = engine.started
    assert with_system.segments == (Segment(len(f"<system>{system}<user>"), SYSTEM),)
    assert without.segments == ()


async def test_a_body_past_the_limit_is_a_413_in_the_openai_shape() -> None:
    engine = ScriptedEngine("ok")
    engine.start()
    info = WorkerInfo(mode="batching", model_name=MODEL, draft_name=None, num_draft_tokens=0)
    runner, port = await start_site(make_worker_app(engine, info, 4096), "127.0.0.1", 0)
    try:
        async with aiohttp.ClientSession() as session:
            small = {"model": MODEL, "messages": [{"role": "user", "content": "x" * 3000}]}
            big = {"model": MODEL, "messages": [{"role": "user", "content": "x" * 5000}]}
            url = f"http://127.0.0.1:{port}/v1/chat/completions"
            async with session.post(url, json=small) as ok:
                assert ok.status == 200
            async with session.post(url, json=big) as refused:
                body = await refused.json()
                assert refused.status == 413
            assert body["error"]["code"] == "body_too_large"
            assert "4096" in body["error"]["message"]
    finally:
        await asyncio.to_thread(engine.stop, 2.0)
        await runner.cleanup()


def test_the_default_body_limit_is_the_routers() -> None:
    from router.config.settings import Settings
    from router.kernel.worker_contract import DEFAULT_MAX_BODY_BYTES
    from router.worker.main import parse_args

    assert Settings.model_fields["max_body_bytes"].default == DEFAULT_MAX_BODY_BYTES
    assert parse_args(["--mode", "batching", "--model", "/m"]).max_body_bytes == (
        DEFAULT_MAX_BODY_BYTES
    )


async def test_a_constraint_failing_mid_answer_is_an_error_never_a_stop(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The scripted tokenizer has no grammar support: the request is given a constraint
    after preparing, and the engine reports its failure as GrammarProcessor would."""
    from router.worker.decoding.constrain import Constraint

    engine = ScriptedEngine('{"a": 1}')
    engine.constraint_fails_at = 2
    prepare = server_module.prepare

    def constrained(
        tokenizer: object, generation: GenerationRequest, *_: object
    ) -> server_module.Prepared:
        prepared = prepare(tokenizer, generation)
        constraint = Constraint("", None, (), "response_format")
        return dataclasses.replace(
            prepared, generation=dataclasses.replace(prepared.generation, constraint=constraint)
        )

    monkeypatch.setattr(server_module, "prepare", constrained)
    async with serving(engine) as url:
        ask = client(url).chat.completions.create
        messages = [{"role": "user", "content": "hi"}]
        with pytest.raises(openai.BadRequestError) as whole:
            await ask(model=MODEL, messages=messages)
        stream = await ask(model=MODEL, messages=messages, stream=True)
        text = ""
        with pytest.raises(openai.APIError) as streamed:
            async for chunk in stream:
                text += (chunk.choices[0].delta.content or "") if chunk.choices else ""
    assert whole.value.code == "constraint_failed"
    assert whole.value.param == "response_format"
    assert "scripted matcher failure" in whole.value.message
    assert text == '{"a": 1}'  # what was sent stays sent; then the error, no stop
    assert "constraint library failed" in streamed.value.message


async def test_queued_counts_wait_behind_a_generation_requests_preparation() -> None:
    """A flood of /v1/tokenize calls: the chat that arrives after them is prepared as soon
    as the count already running ends, before every queued count."""
    from router.worker.engines.engine import Models
    from router.worker.http.server import TOKENIZE
    from tests.conftest import wait_until
    from tests.worker.scripted import CharTokenizer

    gate = threading.Event()
    order: list[str] = []

    class GatedTokenizer(CharTokenizer):
        def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
            order.append(text.removeprefix("<user>"))
            if text.endswith("count0"):
                gate.wait(WAIT)
            return super().encode(text, add_special_tokens)

    engine = ScriptedEngine("ok")
    engine._load = lambda: Models(model=None, tokenizer=GatedTokenizer())
    engine.start()
    info = WorkerInfo(mode="speculative", model_name=MODEL, draft_name=None, num_draft_tokens=0)
    app = make_worker_app(engine, info)
    runner, port = await start_site(app, "127.0.0.1", 0)
    url = f"http://127.0.0.1:{port}"
    try:
        async with aiohttp.ClientSession() as session:

            async def count(i: int) -> int:
                body = {"messages": [{"role": "user", "content": f"count{i}"}]}
                async with session.post(f"{url}/v1/tokenize", json=body) as r:
                    return (await r.json())["count"]

            counts = [asyncio.ensure_future(count(0))]
            await wait_until(lambda: order == ["count0"], WAIT)
            counts += [asyncio.ensure_future(count(i)) for i in range(1, 4)]
            await wait_until(lambda: app[TOKENIZE].waiting() == 3, WAIT)
            chat = asyncio.ensure_future(
                client(url).chat.completions.create(
                    model=MODEL, messages=[{"role": "user", "content": "chat"}]
                )
            )
            await wait_until(lambda: app[TOKENIZE].waiting() == 4, WAIT)
            gate.set()
            reply = await chat
            assert await asyncio.gather(*counts) == [len(f"<user>count{i}") for i in range(4)]
    finally:
        gate.set()
        while _open_clients:
            await _open_clients.pop().close()
        await asyncio.to_thread(engine.stop, 2.0)
        await runner.cleanup()
    assert reply.choices[0].message.content == "ok"
    assert order == ["count0", "chat", "count1", "count2", "count3"]


async def test_with_a_secret_every_endpoint_answers_only_requests_carrying_it() -> None:
    """Issue #36 class 2: a program that found a lane's port gets a 401 in the OpenAI shape,
    before any parsing; the router's requests carry the secret and are served."""
    secret = "a-secret-0123456789abcdef"
    engine = ScriptedEngine("Hello")
    engine.start()
    info = WorkerInfo(mode="batching", model_name=MODEL, draft_name=None, num_draft_tokens=0)
    runner, port = await start_site(make_worker_app(engine, info, secret=secret), "127.0.0.1", 0)
    url = f"http://127.0.0.1:{port}"
    body = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 5}
    try:
        async with aiohttp.ClientSession() as s:
            for headers in ({}, {WORKER_SECRET_HEADER: "wrong"}, {"Authorization": secret}):
                for method, path in [
                    ("GET", "/health"),
                    ("GET", "/v1/models"),
                    ("POST", "/v1/chat/completions"),
                    ("POST", "/v1/completions"),
                    ("POST", "/v1/tokenize"),
                    ("GET", "/nowhere"),
                ]:
                    async with s.request(method, url + path, json=body, headers=headers) as r:
                        assert r.status == 401, (path, headers)
                        error = (await r.json())["error"]
                        assert error["code"] == "worker_secret_required"
            ok = {WORKER_SECRET_HEADER: secret}
            async with s.post(f"{url}/v1/chat/completions", json=body, headers=ok) as r:
                assert r.status == 200
                assert (await r.json())["choices"][0]["message"]["content"] == "Hello"
            async with s.get(f"{url}/health", headers=ok) as r:
                assert r.status == 200
    finally:
        await asyncio.to_thread(engine.stop, 2.0)
        await runner.cleanup()


class NoGrammar:
    """The scripted tokenizer has no grammar support: a forced call is read, not constrained."""

    def compile(self, request: GenerationRequest, tokenizer: object) -> None:
        return None


async def test_a_forced_call_cut_by_max_tokens_answers_the_same_streamed_and_not(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """OpenAI's cut call: ``tool_calls`` with what was written, ``finish_reason: "length"``;
    a stream certain to be a call opens with ``content: null``; every answer and chunk
    carries the model's one ``system_fingerprint``."""
    monkeypatch.setattr(server_module, "COMPILER", NoGrammar())
    cut = CALLING.index("capital")  # one character per token: '{"city": "Paris, the ' written
    written = '{"city": "Paris, the '
    async with serving(ScriptedEngine(CALLING)) as url:
        ask = client(url).chat.completions.create
        fields = dict(
            model=MODEL,
            messages=[{"role": "user", "content": "weather?"}],
            tools=[WEATHER_TOOL],
            tool_choice="required",
            max_tokens=cut,
        )
        reply = await ask(**fields)  # type: ignore[call-overload]
        stream = await ask(stream=True, **fields)  # type: ignore[call-overload]
        chunks = [chunk async for chunk in stream]
        plain = await ask(model=MODEL, messages=[{"role": "user", "content": "hi"}], stream=True)
        plain_chunks = [chunk async for chunk in plain]
    choice = reply.choices[0]
    assert choice.finish_reason == "length" and choice.message.content == "Checking."
    (call,) = choice.message.tool_calls or []
    assert (call.function.name, call.function.arguments) == ("get_weather", written)
    deltas = [d for c in chunks for d in c.choices[0].delta.tool_calls or []]
    assert deltas[0].function is not None and deltas[0].function.name == "get_weather"
    assert "".join(d.function.arguments or "" for d in deltas if d.function) == written
    assert [c.choices[0].finish_reason for c in chunks if c.choices[0].finish_reason] == ["length"]
    assert chunks[0].choices[0].delta.role == "assistant"
    head = chunks[0].choices[0].delta
    assert head.content is None and "content" in head.model_fields_set  # null, not absent
    assert plain_chunks[0].choices[0].delta.content == ""  # an answer that may be text
    fingerprints = {reply.system_fingerprint} | {c.system_fingerprint for c in chunks}
    assert fingerprints == {c.system_fingerprint for c in plain_chunks}
    (fingerprint,) = fingerprints
    assert fingerprint is not None and fingerprint.startswith("fp_")


# --- log-probabilities ------------------------------------------------------------------------


async def test_chat_logprobs_come_in_openais_shape_streamed_and_not() -> None:
    async with serving(ScriptedEngine("abc")) as url:
        ask = client(url).chat.completions.create
        messages = [{"role": "user", "content": "hi"}]
        reply = await ask(model=MODEL, messages=messages, logprobs=True, top_logprobs=2)  # type: ignore[arg-type]
        stream = await ask(model=MODEL, messages=messages, logprobs=True, stream=True)  # type: ignore[arg-type]
        chunks = [c async for c in stream]
        plain = await ask(model=MODEL, messages=messages)  # type: ignore[arg-type]
    assert plain.choices[0].logprobs is None  # not asked: none computed, none sent
    logprobs = reply.choices[0].logprobs
    assert logprobs is not None and logprobs.content is not None
    assert [e.token for e in logprobs.content] == ["a", "b", "c"]
    assert [e.logprob for e in logprobs.content] == [-0.25, -0.5, -0.75]
    first = logprobs.content[0]
    assert first.bytes == [ord("a")]
    assert [(t.token, t.logprob, t.bytes) for t in first.top_logprobs] == [
        ("a", -0.25, [ord("a")]),
        ("?", -9.0, [ord("?")]),
    ]
    # Streamed: each chunk's entries are its own text's, no alternatives without top_logprobs.
    for c in chunks:
        entries = c.choices[0].logprobs.content if c.choices[0].logprobs else []
        assert "".join(e.token for e in entries or []) == (c.choices[0].delta.content or "")
        assert all(e.top_logprobs == [] for e in entries or [])
    streamed = [
        e for c in chunks if c.choices[0].logprobs for e in c.choices[0].logprobs.content or []
    ]
    assert [e.logprob for e in streamed] == [-0.25, -0.5, -0.75]


async def test_a_stop_string_keeps_the_logprobs_in_line_with_the_text_sent() -> None:
    """Text held back while it might start a stop string carries its entries when it goes
    out; the stop string's tokens are not reported, a token it cuts in two only with the part
    that was sent (here a character per token: none is cut)."""
    async with serving(ScriptedEngine("one two three")) as url:
        ask = client(url).chat.completions.create
        messages = [{"role": "user", "content": "hi"}]
        fields = dict(model=MODEL, messages=messages, logprobs=True, stop=[" tw", "ne!"])
        reply = await ask(**fields)  # type: ignore[call-overload]
        stream = await ask(stream=True, **fields)  # type: ignore[call-overload]
        chunks = [c async for c in stream]
    content = reply.choices[0].message.content
    assert content == "one"
    logprobs = reply.choices[0].logprobs
    assert logprobs is not None and logprobs.content is not None
    assert "".join(e.token for e in logprobs.content) == content
    for c in chunks:
        entries = (c.choices[0].logprobs.content or []) if c.choices[0].logprobs else []
        assert "".join(e.token for e in entries) == (c.choices[0].delta.content or "")
    text = "".join(c.choices[0].delta.content or "" for c in chunks)
    assert text == content
    assert "ne" in [c.choices[0].delta.content for c in chunks]  # held, then sent together


async def test_completion_logprobs_come_in_the_legacy_shape_streamed_and_not() -> None:
    async with serving(ScriptedEngine("hey")) as url:
        c = client(url)
        whole = await c.completions.create(model=MODEL, prompt="x", logprobs=1)
        stream = await c.completions.create(model=MODEL, prompt="x", logprobs=0, stream=True)
        chunks = [chunk async for chunk in stream]
    logprobs = whole.choices[0].logprobs
    assert logprobs is not None
    assert logprobs.tokens == ["h", "e", "y"]
    assert logprobs.token_logprobs == [-0.25, -0.5, -0.75]
    assert logprobs.top_logprobs == [{"h": -0.25}, {"e": -0.5}, {"y": -0.75}]
    assert logprobs.text_offset == [0, 1, 2]
    offsets = [
        o
        for ch in chunks
        if ch.choices[0].logprobs
        for o in ch.choices[0].logprobs.text_offset or []
    ]
    assert offsets == [0, 1, 2]  # counted across the stream's chunks
    assert all(
        top == {}
        for ch in chunks
        if ch.choices[0].logprobs
        for top in ch.choices[0].logprobs.top_logprobs or []
    )


@pytest.mark.parametrize(
    ("path", "body", "param"),
    [
        ("chat/completions", {"logprobs": True, "top_logprobs": 21}, "top_logprobs"),
        ("chat/completions", {"top_logprobs": 2}, "top_logprobs"),
        ("chat/completions", {"logprobs": 2}, "logprobs"),
        ("completions", {"logprobs": 6}, "logprobs"),
        ("completions", {"logprobs": True}, "logprobs"),
    ],
)
async def test_logprobs_outside_openais_ranges_are_a_400_naming_the_field(
    path: str, body: dict[str, object], param: str
) -> None:
    base = {"messages": [{"role": "user", "content": "hi"}]} if path.startswith("chat") else {}
    base = base or {"prompt": "x"}
    async with serving(ScriptedEngine("a")) as url, aiohttp.ClientSession() as session:
        async with session.post(f"{url}/v1/{path}", json={**base, **body}) as r:
            assert r.status == 400
            error = (await r.json())["error"]
    assert error["param"] == param


# --- n choices ----------------------------------------------------------------------------


async def test_n_choices_come_whole_and_streamed_with_the_usage_of_all() -> None:
    engine = ScriptedEngine("abc")
    async with serving(engine) as url:
        ask = client(url).chat.completions.create
        messages = [{"role": "user", "content": "hi"}]
        whole = await ask(model=MODEL, messages=messages, n=3, logprobs=True)  # type: ignore[arg-type]
        stream = await ask(
            model=MODEL,
            messages=messages,  # type: ignore[arg-type]
            n=2,
            stream=True,
            stream_options={"include_usage": True},
        )
        chunks = [c async for c in stream]
    prompt = len("<user>hi")
    assert [c.index for c in whole.choices] == [0, 1, 2]
    assert all(c.message.content == "abc" and c.finish_reason == "stop" for c in whole.choices)
    assert all(c.logprobs is not None and len(c.logprobs.content or []) == 3 for c in whole.choices)
    assert whole.usage is not None
    assert (whole.usage.prompt_tokens, whole.usage.completion_tokens) == (prompt, 9)
    assert whole.usage.total_tokens == prompt + 9
    assert len(engine.started) == 5  # one job per choice
    texts: dict[int, str] = {}
    finishes: dict[int, list[str]] = {}
    for c in chunks:
        for choice in c.choices:
            texts[choice.index] = texts.get(choice.index, "") + (choice.delta.content or "")
            if choice.finish_reason:
                finishes.setdefault(choice.index, []).append(choice.finish_reason)
    assert texts == {0: "abc", 1: "abc"} and finishes == {0: ["stop"], 1: ["stop"]}
    assert [c for c in chunks if c.usage is not None] == [chunks[-1]]
    assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens == 6


async def test_a_seeded_request_gives_each_choice_its_own_seed() -> None:
    engine = ScriptedEngine("ab")
    async with serving(engine) as url:
        await client(url).completions.create(model=MODEL, prompt="x", n=3, seed=7)
    assert sorted(job.request.seed for job in engine.started) == [7, 8, 9]


async def test_health_says_the_context_length_the_router_lists() -> None:
    async with serving(ScriptedEngine("x"), context_length=2048) as url:
        async with aiohttp.ClientSession() as session:
            answer = await health(session, url)
    assert answer["context_length"] == 2048
