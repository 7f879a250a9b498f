"""What a request's translation costs: linear in the request (or bounded), and off the event
loop when large (router.proxy.offload).

The costs are counted (bytes encoded, names compared), not timed; the one timed test, a
follow-up on a long stored conversation, bounds how long the event loop goes unanswered
against a baseline measured the same way (a probe that sleeps 5 ms at a time), with a
margin that a busy machine does not reach and the old, quadratic join far exceeds.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import aiohttp
import orjson
import pytest

from router.frontdoors import anthropic_context, anthropic_in, ollama_in, responses_in
from router.frontdoors.ollama_out import OllamaEgress
from router.frontdoors.responses_out import ResponsesEgress
from router.kernel.errors import RouterError
from router.proxy.offload import INLINE_BYTES, CpuPool
from tests.conftest import fake_upstreams, router_settings, run_router
from tests.fakes.upstream import FakeUpstream

MODEL = "fake-model"


# --- Anthropic context_management ----------------------------------------------------------


def tool_history(rounds: int, result_chars: int) -> list[dict[str, Any]]:
    messages: list[dict[str, Any]] = [{"role": "user", "content": "go"}]
    for n in range(rounds):
        messages.append(
            {
                "role": "assistant",
                "content": [{"type": "tool_use", "id": f"t{n}", "name": "Read", "input": {"n": n}}],
            }
        )
        messages.append(
            {
                "role": "user",
                "content": [
                    {"type": "tool_result", "tool_use_id": f"t{n}", "content": "x" * result_chars}
                ],
            }
        )
    return messages


def clear(**fields: Any) -> dict[str, Any]:
    return {
        "type": "clear_tool_uses_20250919",
        "trigger": {"type": "tool_uses", "value": 0},
        "keep": {"type": "tool_uses", "value": 0},
        **fields,
    }


def anthropic_body(messages: list[dict[str, Any]], edits: list[dict[str, Any]]) -> dict[str, Any]:
    return {
        "model": MODEL,
        "max_tokens": 4,
        "messages": messages,
        "context_management": {"edits": edits},
    }


class CountingOrjson:
    """orjson, counting the bytes it encodes."""

    JSONEncodeError = orjson.JSONEncodeError

    def __init__(self) -> None:
        self.encoded = 0

    def dumps(self, value: Any, *args: Any, **kwargs: Any) -> bytes:
        out = orjson.dumps(value, *args, **kwargs)
        self.encoded += len(out)
        return out


@pytest.mark.parametrize("applied", [False, True], ids=["refused", "applied"])
def test_context_edits_encode_the_history_once(
    monkeypatch: pytest.MonkeyPatch, applied: bool
) -> None:
    """Each edit encoded the whole history again: 2,000 edits over 430 KB held the loop
    5.3 s. Now the edits together encode it about once (each result once more, at most)."""
    messages = tool_history(200, 2000)
    size = len(orjson.dumps(messages))
    # Refused: each edit would free less than it must, so nothing changes and every edit
    # looks at every result again. Applied: the first edit clears, the others find nothing.
    edit = clear() if applied else clear(clear_at_least={"type": "input_tokens", "value": 10**9})
    counting = CountingOrjson()
    monkeypatch.setattr(anthropic_context, "orjson", counting)
    edited = anthropic_context.apply(
        anthropic_body(messages, [edit] * anthropic_context.MAX_EDITS), messages
    )
    assert len(edited.applied) == (1 if applied else 0)
    assert counting.encoded < 2.2 * size, (counting.encoded, size)


def test_a_request_carries_a_bounded_number_of_edits() -> None:
    messages = tool_history(2, 10)
    thinking = {"type": "clear_thinking_20251015", "keep": "all"}
    anthropic_in.to_openai(anthropic_body(messages, [thinking] * anthropic_context.MAX_EDITS))
    with pytest.raises(RouterError) as refused:
        anthropic_in.to_openai(
            anthropic_body(messages, [thinking] * (anthropic_context.MAX_EDITS + 1))
        )
    assert refused.value.status == 400 and refused.value.param == "context_management.edits"
    assert f"at most {anthropic_context.MAX_EDITS}" in refused.value.message


async def test_too_many_edits_is_a_400_in_anthropics_shape(fake: FakeUpstream) -> None:
    body = anthropic_body(tool_history(2, 10), [clear()] * 2000)
    async with (
        run_router(router_settings(fake)) as r,
        aiohttp.ClientSession() as s,
        s.post(f"{r.url}/v1/messages", json=body) as resp,
    ):
        status, answer = resp.status, await resp.json()
    assert status == 400 and answer["type"] == "error", answer
    assert answer["error"]["type"] == "invalid_request_error"
    assert "at most 16 are accepted" in answer["error"]["message"]
    assert not fake.requests


def test_the_size_a_trigger_reads_follows_the_edits_before_it() -> None:
    """The history is encoded once and its size then kept as edits change blocks: a later
    edit's input_tokens trigger sees exactly the size a fresh encoding would give (blocks
    without the field an edit sets included)."""
    messages = tool_history(6, 400)
    messages[2]["content"][0].pop("content")  # a result without content
    messages[3]["content"][0].pop("input")  # a call without input
    first = clear(keep={"type": "tool_uses", "value": 2}, clear_tool_inputs=True)
    alone = anthropic_context.apply(anthropic_body(messages, [first]), messages)
    size = len(orjson.dumps([None, alone.messages, None])) // anthropic_context.CHARS_PER_TOKEN
    for trigger, applied in ((size, 2), (size + 1, 1)):
        second = clear(trigger={"type": "input_tokens", "value": trigger})
        edited = anthropic_context.apply(anthropic_body(messages, [first, second]), messages)
        assert len(edited.applied) == applied, (trigger, edited.applied)


def test_edits_keep_the_clients_body_as_sent() -> None:
    messages = tool_history(3, 10)
    sent = orjson.dumps(messages)
    edited = anthropic_context.apply(anthropic_body(messages, [clear(), clear()]), messages)
    assert orjson.dumps(messages) == sent
    results = [m["content"][0]["content"] for m in edited.messages[2::2]]
    assert results == [anthropic_context.CLEARED_RESULT] * 3


# --- Ollama tool messages --------------------------------------------------------------------


class Name(str):
    """A tool name that counts the comparisons made with it."""

    compared = 0
    __hash__ = str.__hash__

    def __eq__(self, other: object) -> bool:
        Name.compared += 1
        return str.__eq__(self, other)


def test_ollama_tool_messages_find_their_calls_in_constant_time() -> None:
    """Each tool message scanned the calls still open: quadratic when many stay open."""
    calls = 2000
    messages: list[dict[str, Any]] = [
        {
            "role": "assistant",
            "content": "",
            "tool_calls": [
                {"function": {"name": Name("open"), "arguments": {}}} for _ in range(calls)
            ],
        }
    ]
    messages += [{"role": "tool", "content": "r", "tool_name": Name("other")}] * calls
    messages += [{"role": "tool", "content": "r", "tool_name": None}] * 2
    Name.compared = 0
    out = ollama_in.chat_to_openai({"model": MODEL, "messages": messages, "stream": False})
    assert Name.compared <= 4 * calls, Name.compared
    ids = [m["tool_call_id"] for m in out.openai["messages"] if m["role"] == "tool"]
    assert ids[:2] == ["call_2001_unmatched"] * 2
    assert ids[-2:] == ["call_1", "call_2"]  # no name: the oldest open calls


def test_ollama_tool_messages_answer_the_oldest_open_call_of_their_tool() -> None:
    call = {"role": "assistant", "content": ""}
    messages = [
        {
            **call,
            "tool_calls": [
                {"function": {"name": n, "arguments": {}}} for n in ("a", "b", "a", "c")
            ],
        },
        {"role": "tool", "content": "1", "tool_name": "a"},
        {"role": "tool", "content": "2"},
        {"role": "tool", "content": "3", "tool_name": "a"},
        {"role": "tool", "content": "4"},
        {"role": "tool", "content": "5"},
        {"role": "tool", "content": "6", "tool_name": "zzz"},
    ]
    out = ollama_in.chat_to_openai({"model": MODEL, "messages": messages})
    ids = [m["tool_call_id"] for m in out.openai["messages"] if m["role"] == "tool"]
    assert ids == ["call_1", "call_2", "call_3", "call_4", "call_5_unmatched", "call_5_unmatched"]


# --- off the loop ----------------------------------------------------------------------------


async def test_the_pool_runs_large_work_on_a_thread_and_small_work_inline() -> None:
    pool = CpuPool(workers=1)
    try:
        loop_thread = await pool.run(10, threading.get_ident)
        assert loop_thread == threading.get_ident() and pool.offloaded == 0
        other = await pool.run(INLINE_BYTES + 1, threading.get_ident)
        assert other != loop_thread and pool.offloaded == 1

        def fail() -> None:
            raise RouterError(400, "refused")

        with pytest.raises(RouterError):
            await pool.run(INLINE_BYTES + 1, fail)
    finally:
        pool.close()


def chat(text: str) -> dict[str, Any]:
    return {"messages": [{"role": "user", "content": text}]}


BODIES = {
    "/v1/chat/completions": chat,
    "/v1/messages": lambda text: {"max_tokens": 4, **chat(text)},
    "/api/chat": chat,
    "/api/generate": lambda text: {"prompt": text},
    "/v1/responses": lambda text: {"input": text},
}


@pytest.mark.parametrize("path", sorted(BODIES))
async def test_a_large_body_is_translated_off_the_loop(fake: FakeUpstream, path: str) -> None:
    async with run_router(router_settings(fake)) as r, aiohttp.ClientSession() as s:
        for text, offloaded in (("hi", False), ("x" * (INLINE_BYTES + 1), True)):
            body = {**BODIES[path](text), "model": MODEL, "stream": False}
            async with s.post(r.url + path, json=body) as resp:
                assert resp.status == 200, await resp.text()
            assert (r.services.cpu.offloaded > 0) is offloaded


# --- a follow-up on a long stored conversation ------------------------------------------------


class LoopLag:
    """The longest the event loop went without running a 5 ms sleep's wake-up, late."""

    TICK = 0.005

    def __init__(self) -> None:
        self.worst = 0.0

    @asynccontextmanager
    async def probe(self) -> AsyncIterator[None]:
        loop = asyncio.get_running_loop()

        async def run() -> None:
            while True:
                start = loop.time()
                await asyncio.sleep(self.TICK)
                self.worst = max(self.worst, loop.time() - start - self.TICK)

        task = asyncio.create_task(run())
        await asyncio.sleep(0)
        try:
            yield
        finally:
            task.cancel()


async def follow_up(s: aiohttp.ClientSession, url: str, items: int, chars: int) -> float:
    """Store a conversation of ``items`` developer messages of ``chars`` characters, then
    send a 100-byte follow-up on it; how long the loop went unanswered during the follow-up."""
    first = {
        "model": MODEL,
        "input": [
            {"type": "message", "role": "developer", "content": f"{n}" + "r" * chars}
            for n in range(items)
        ],
    }
    async with s.post(url, json=first) as resp:
        assert resp.status == 200, await resp.text()
        stored = (await resp.json())["id"]
    lag = LoopLag()
    async with (
        lag.probe(),
        s.post(
            url, json={"model": MODEL, "previous_response_id": stored, "input": "and then?"}
        ) as resp,
    ):
        assert resp.status == 200, await resp.text()
        await resp.read()
    return lag.worst


async def test_a_follow_up_on_a_long_conversation_leaves_the_loop_free() -> None:
    """The door joined adjacent system messages one at a time, copying the text so far at
    each: a 118-byte follow-up on a long stored conversation held the loop 1.3 s. Here a
    conversation of 4,000 developer messages (7.6 MB; the old join copied ~15 GB) against a
    baseline of 20: the loop must not go unanswered longer than 1 s more than it did for
    the baseline (the old code held it 5 s on the 2-core test machine; the new one ~50 ms,
    up to 0.4 s when the machine is busy)."""
    async with (
        fake_upstreams("fake", max_body=16 * 1024**2) as (fake,),
        run_router(router_settings(fake)) as r,
        aiohttp.ClientSession() as s,
    ):
        url = f"{r.url}/v1/responses"
        baseline = await follow_up(s, url, 20, 1900)
        long = await follow_up(s, url, 4000, 1900)
    assert long < 1.0 + 3 * baseline, (long, baseline)
    joined = fake.requests[-1].body["messages"][0]
    assert joined["role"] == "system" and joined["content"].count("\n\n") == 3999


# --- answers streamed in small pieces ---------------------------------------------------------


class Delta(str):
    """A streamed piece that counts the characters copied when text is added to it
    (``text += piece`` makes Python ask the piece, a subclass, first)."""

    copied = 0

    def __radd__(self, other: str) -> str:
        Delta.copied += len(other) + len(self)
        return str.__add__(other, self)


def deltas(event: Any, count: int) -> list[dict[str, Any]]:
    return [{"choices": [{"index": 0, "delta": event(Delta("0123456789"))}]} for _ in range(count)]


@pytest.mark.parametrize("what", ["text", "arguments"])
def test_a_responses_stream_in_small_pieces_costs_its_length(what: str) -> None:
    """Each piece was added to the text so far (``self._text += text``): an answer of n
    pieces copied n²/2 pieces, on the event loop."""
    count = 2000

    def piece(text: str) -> dict[str, Any]:
        if what == "text":
            return {"content": text}
        return {"tool_calls": [{"index": 0, "function": {"name": "f", "arguments": text}}]}

    saved: list[Any] = []
    egress = ResponsesEgress(
        responses_in.to_openai({"model": MODEL, "input": "hi", "stream": True}),
        0,
        lambda response, messages: saved.append(messages),
    )
    Delta.copied = 0
    for event in deltas(piece, count):
        egress._chunk(event)
    egress.finish()
    assert Delta.copied <= 4 * 10 * count, Delta.copied
    answer = saved[0][-1]
    got = answer["content"] if what == "text" else answer["tool_calls"][0]["function"]["arguments"]
    assert got == "0123456789" * count


def test_an_ollama_stream_of_call_pieces_costs_its_length() -> None:
    count = 2000
    egress = OllamaEgress("chat", MODEL, 0.0)
    Delta.copied = 0

    def piece(text: str) -> dict[str, Any]:
        return {"tool_calls": [{"index": 0, "function": {"name": text, "arguments": text}}]}

    for event in deltas(piece, count):
        egress._chunk(event)
    assert Delta.copied <= 4 * 10 * count, Delta.copied
