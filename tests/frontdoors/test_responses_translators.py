"""The Responses API translators (pure): request in, answer out, the store's bounds."""

from __future__ import annotations

from typing import Any

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from openai.types.responses import Response, ResponseStreamEvent
from pydantic import TypeAdapter

from router.frontdoors import responses_in
from router.frontdoors.responses_out import ResponsesEgress
from router.frontdoors.responses_store import ResponseStore
from router.kernel.errors import RouterError
from router.kernel.sse import json_events as openai_events
from tests.fuzzing import examples

WEATHER = {
    "type": "function",
    "name": "get_weather",
    "description": "Weather in a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
}


def translate(**body: Any) -> responses_in.ResponsesRequest:
    return responses_in.to_openai({"model": "m", **body})


def test_string_input_and_instructions() -> None:
    req = translate(
        input="Hi",
        instructions="Be brief.",
        max_output_tokens=9,
        stream=True,
        temperature=0.2,
        top_p=0.9,
        reasoning={"effort": "low"},
        include=["reasoning.encrypted_content"],
        client_metadata={"x": "y"},
    )
    assert req.openai == {
        "model": "m",
        "messages": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}],
        "max_tokens": 9,
        "temperature": 0.2,
        "top_p": 0.9,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    assert req.conversation == [{"role": "user", "content": "Hi"}]  # no instructions
    assert req.store and req.stream


def test_items_become_chat_messages() -> None:
    """Codex's shape: developer messages first, then a call, its output, more text."""
    req = translate(
        input=[
            {
                "type": "message",
                "role": "developer",
                "content": [{"type": "input_text", "text": "Rules."}],
            },
            {"role": "system", "content": "More rules."},
            {
                "type": "message",
                "role": "user",
                "content": [
                    {"type": "input_text", "text": "a"},
                    {"type": "input_text", "text": "b"},
                ],
            },
            {"type": "reasoning", "id": "rs_1", "summary": [], "encrypted_content": "xx"},
            {
                "type": "message",
                "role": "assistant",
                "content": [{"type": "output_text", "text": "Checking."}],
            },
            {
                "type": "function_call",
                "call_id": "c1",
                "name": "get_weather",
                "arguments": '{"city":"Paris"}',
            },
            {
                "type": "function_call",
                "call_id": "c2",
                "name": "spawn_agent",
                "namespace": "agents",
                "arguments": "",
            },
            {"type": "function_call_output", "call_id": "c1", "output": "sunny"},
            {
                "type": "function_call_output",
                "call_id": "c2",
                "output": [{"type": "input_text", "text": "done"}],
            },
        ],
        instructions="Top.",
    )
    assert req.openai["messages"] == [
        {"role": "system", "content": "Top.\n\nRules.\n\nMore rules."},
        {"role": "user", "content": "a\nb"},
        {
            "role": "assistant",
            "content": "Checking.",
            "tool_calls": [
                {
                    "id": "c1",
                    "type": "function",
                    "function": {"name": "get_weather", "arguments": '{"city":"Paris"}'},
                },
                {
                    "id": "c2",
                    "type": "function",
                    "function": {"name": "agents__spawn_agent", "arguments": "{}"},
                },
            ],
        },
        {"role": "tool", "tool_call_id": "c1", "content": "sunny"},
        {"role": "tool", "tool_call_id": "c2", "content": "done"},
    ]


def test_tools_choice_and_format() -> None:
    namespace = {
        "type": "namespace",
        "name": "agents",
        "description": "d",
        "tools": [{"type": "function", "name": "spawn", "parameters": None}],
    }
    req = translate(
        input="x",
        tools=[WEATHER, namespace, {"type": "web_search"}],
        tool_choice={"type": "function", "name": "get_weather"},
        parallel_tool_calls=False,
        prompt_cache_key="conv-1",
        text={
            "format": {
                "type": "json_schema",
                "name": "w",
                "strict": True,
                "schema": {"type": "object"},
            }
        },
    )
    names = [t["function"]["name"] for t in req.openai["tools"]]
    assert names == ["get_weather", "agents__spawn"]
    assert req.openai["tools"][1]["function"]["parameters"] == {"type": "object", "properties": {}}
    assert req.namespaces == {"agents__spawn": ("agents", "spawn")}
    assert req.openai["tool_choice"] == {"type": "function", "function": {"name": "get_weather"}}
    assert req.openai["parallel_tool_calls"] is False
    assert req.openai["prompt_cache_key"] == "conv-1"
    assert req.openai["response_format"] == {
        "type": "json_schema",
        "json_schema": {"name": "w", "schema": {"type": "object"}, "strict": True},
    }
    assert [t["type"] for t in req.echo["tools"]] == ["function", "namespace"]


def test_previous_conversation_comes_first() -> None:
    history = [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello"}]
    req = responses_in.to_openai({"model": "m", "input": "And?", "instructions": "New."}, history)
    assert req.openai["messages"] == [
        {"role": "system", "content": "New."},
        *history,
        {"role": "user", "content": "And?"},
    ]
    assert req.conversation == [*history, {"role": "user", "content": "And?"}]


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({"input": "x", "background": True}, "background"),
        ({"input": "x", "conversation": "conv_1"}, "conversation"),
        ({"input": "x", "tools": [{"type": "code_interpreter"}]}, "tools[0]"),
        ({"input": "x", "tools": [{"type": "custom", "name": "apply_patch"}]}, "tools[0]"),
        ({"input": [{"type": "item_reference", "id": "x"}]}, "input[0]"),
        (
            {"input": [{"role": "user", "content": [{"type": "input_file", "file_id": "f"}]}]},
            "input[0].content[0]",
        ),
        ({"input": [{"role": "tool", "content": "x"}]}, "input[0]"),
        ({"input": [{"type": "function_call", "name": "f"}]}, "input[0]"),
        ({"input": []}, "input"),
        ({"input": "x", "text": {"format": {"type": "grammar"}}}, "text.format"),
        ({"input": "x", "tool_choice": {"type": "mcp"}}, "tool_choice"),
        ({"input": "x", "metadata": {str(i): "v" for i in range(17)}}, "metadata"),
        ({"input": "x", "max_output_tokens": 0}, "max_output_tokens"),
        ({"input": ["x"] * (responses_in.MAX_INPUT_ITEMS + 1)}, "input"),
        ({"input": "x", "tools": [WEATHER] * (responses_in.MAX_TOOLS + 1)}, "tools"),
    ],
)
def test_refusals_name_the_field(body: dict[str, Any], param: str) -> None:
    with pytest.raises(RouterError) as refused:
        translate(**body)
    assert refused.value.status == 400 and refused.value.param == param


# --- answers ------------------------------------------------------------------------------

RESPONSE = TypeAdapter(Response)
EVENT = TypeAdapter(ResponseStreamEvent)


def chat_answer(
    content: str | None, calls: list[dict[str, Any]] | None = None, finish: str = "stop"
) -> dict[str, Any]:
    message: dict[str, Any] = {"role": "assistant", "content": content}
    if calls:
        message["tool_calls"] = calls
    return {
        "id": "chatcmpl-1",
        "choices": [{"index": 0, "message": message, "finish_reason": finish}],
        "usage": {
            "prompt_tokens": 10,
            "completion_tokens": 3,
            "prompt_tokens_details": {"cached_tokens": 8},
        },
    }


def test_whole_answer_is_a_valid_response_and_is_saved() -> None:
    saved: list[Any] = []
    req = translate(input="Hi", tools=[WEATHER], metadata={"k": "v"})
    egress = ResponsesEgress(req, 1700000000, lambda r, m: saved.append((r, m)))
    call = {
        "id": "call_1",
        "type": "function",
        "function": {"name": "get_weather", "arguments": '{"city":"Paris"}'},
    }
    body = orjson.loads(egress.body(chat_answer("Let me look.", [call], "tool_calls")))
    response = RESPONSE.validate_python(body)
    assert response.status == "completed" and response.metadata == {"k": "v"}
    assert [o.type for o in response.output] == ["message", "function_call"]
    assert response.output_text == "Let me look."
    fc = response.output[1]
    assert fc.type == "function_call" and (fc.call_id, fc.name) == ("call_1", "get_weather")
    assert response.usage is not None
    assert (
        response.usage.input_tokens,
        response.usage.output_tokens,
        response.usage.input_tokens_details.cached_tokens,
    ) == (10, 3, 8)
    ((stored, messages),) = saved
    assert stored == body
    assert messages == [
        {"role": "user", "content": "Hi"},
        {"role": "assistant", "content": "Let me look.", "tool_calls": [call]},
    ]


def test_cut_answer_is_incomplete() -> None:
    body = orjson.loads(
        ResponsesEgress(translate(input="Hi"), 0).body(chat_answer("abc", finish="length"))
    )
    assert body["status"] == "incomplete"
    assert body["incomplete_details"] == {"reason": "max_output_tokens"}


def sse(*events: dict[str, Any]) -> bytes:
    return b"".join(b"data: " + orjson.dumps(e) + b"\n\n" for e in events) + b"data: [DONE]\n\n"


def chunk(delta: dict[str, Any], finish: str | None = None) -> dict[str, Any]:
    return {"choices": [{"index": 0, "delta": delta, "finish_reason": finish}]}


def parse_stream(data: bytes) -> list[Any]:
    return [EVENT.validate_python(e) for e in openai_events(data)]


def test_stream_event_sequence() -> None:
    saved: list[Any] = []
    req = translate(input="Hi", tools=[WEATHER], stream=True)
    egress = ResponsesEgress(req, 5, lambda r, m: saved.append((r, m)))
    upstream = sse(
        chunk({"role": "assistant", "content": ""}),
        chunk({"content": "Let "}),
        chunk({"content": "me."}),
        chunk(
            {
                "tool_calls": [
                    {
                        "index": 0,
                        "id": "call_9",
                        "type": "function",
                        "function": {"name": "get_weather", "arguments": ""},
                    }
                ]
            }
        ),
        chunk({"tool_calls": [{"index": 0, "function": {"arguments": '{"city":'}}]}),
        chunk({"tool_calls": [{"index": 0, "function": {"arguments": '"Paris"}'}}]}),
        chunk({}, "tool_calls"),
        {"choices": [], "usage": {"prompt_tokens": 4, "completion_tokens": 6}},
    )
    data = egress.events(upstream[:50]) + egress.events(upstream[50:]) + egress.finish()
    events = parse_stream(data)
    assert [e.type for e in events] == [
        "response.created",
        "response.in_progress",
        "response.output_item.added",
        "response.content_part.added",
        "response.output_text.delta",
        "response.output_text.delta",
        "response.output_text.done",
        "response.content_part.done",
        "response.output_item.done",
        "response.output_item.added",
        "response.function_call_arguments.delta",
        "response.function_call_arguments.delta",
        "response.function_call_arguments.done",
        "response.output_item.done",
        "response.completed",
    ]
    assert [e.sequence_number for e in events] == list(range(len(events)))
    assert b"[DONE]" not in data
    final = events[-1].response
    assert final.output_text == "Let me."
    assert final.output[1].arguments == '{"city":"Paris"}'
    assert final.usage.output_tokens == 6
    assert events[0].response.id == final.id and final.status == "completed"
    assert saved[0][0] == orjson.loads(data.split(b"data: ")[-1])["response"]


def test_stream_failure_ends_with_response_failed() -> None:
    egress = ResponsesEgress(translate(input="Hi", stream=True), 0)
    data = egress.events(b"data: " + orjson.dumps(chunk({"content": "a"})) + b"\n\n")
    data += egress.events(b'data: {"error": {"message": "boom", "code": 500}}\n\n')
    data += egress.finish()
    events = parse_stream(data)
    assert events[-1].type == "response.failed"
    assert events[-1].response.error.code == "server_error"
    assert "boom" in events[-1].response.error.message
    assert [e.sequence_number for e in events] == list(range(len(events)))


def test_namespaced_call_is_split_back() -> None:
    namespace = {
        "type": "namespace",
        "name": "agents",
        "description": "d",
        "tools": [{"type": "function", "name": "spawn", "parameters": {}}],
    }
    req = translate(input="x", tools=[namespace])
    call = {
        "id": "call_1",
        "type": "function",
        "function": {"name": "agents__spawn", "arguments": "{}"},
    }
    body = orjson.loads(ResponsesEgress(req, 0).body(chat_answer(None, [call], "tool_calls")))
    assert (body["output"][0]["namespace"], body["output"][0]["name"]) == ("agents", "spawn")


# --- the store ----------------------------------------------------------------------------


def test_store_is_bounded_by_count_and_bytes_and_keyed_by_client() -> None:
    store = ResponseStore(max_entries=2, max_bytes=2000)
    message = [{"role": "user", "content": "x" * 100}]
    assert store.put("a", "r1", {"id": "r1"}, message)
    assert store.put("a", "r2", {"id": "r2"}, message)
    assert store.get("b", "r1") is None  # another client's id is not visible
    assert store.get("a", "r1") is not None  # r1 is now the most recent
    assert store.put("a", "r3", {"id": "r3"}, message)
    assert store.get("a", "r2") is None and len(store) == 2  # LRU evicted by count
    assert not store.put("a", "big", {"id": "big"}, [{"content": "x" * 3000}])
    assert store.put("a", "r4", {"id": "r4"}, [{"content": "x" * 1300}])
    assert len(store) == 1 and store.bytes <= 2000  # evicted by bytes
    assert store.delete("a", "r4") and store.bytes == 0 and not store.delete("a", "r4")


# --- hostile input ------------------------------------------------------------------------

KEYS = st.sampled_from(
    [
        "model",
        "input",
        "type",
        "role",
        "content",
        "text",
        "call_id",
        "name",
        "arguments",
        "output",
        "tools",
        "tool_choice",
        "namespace",
        "parameters",
        "format",
        "schema",
        "instructions",
        "metadata",
        "choices",
        "delta",
        "tool_calls",
        "function",
        "index",
        "usage",
        "finish_reason",
        "error",
        "message",
        "id",
    ]
)
JSON = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-5, 10**6)
    | st.floats(allow_nan=False)
    | st.sampled_from(
        [
            "user",
            "assistant",
            "developer",
            "message",
            "function_call",
            "function_call_output",
            "input_text",
            "output_text",
            "function",
            "namespace",
            "json_schema",
            "auto",
            "m",
            "",
            "stop",
            "length",
        ]
    ),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(KEYS, inner, max_size=6),
    max_leaves=30,
)


@settings(max_examples=examples(300), deadline=None)
@given(JSON)
def test_any_request_is_translated_or_refused(body: object) -> None:
    try:
        responses_in.to_openai(body if isinstance(body, dict) else {"input": body})
    except RouterError as e:
        assert e.status == 400


@settings(max_examples=examples(200), deadline=None)
@given(st.lists(JSON, max_size=5))
def test_any_upstream_event_is_translated_or_skipped(events: list[object]) -> None:
    data = b"".join(b"data: " + orjson.dumps(e) + b"\n\n" for e in events)
    egress = ResponsesEgress(translate(input="x", stream=True), 0)
    out = egress.events(data) + egress.finish()
    assert out.startswith(b"event: response.created")
    for event in events:
        try:
            ResponsesEgress(translate(input="x"), 0).body(event)
        except RouterError as e:
            assert e.status == 502


def test_stream_cut_by_the_token_limit_ends_incomplete() -> None:
    egress = ResponsesEgress(translate(input="Hi", stream=True), 0)
    data = egress.events(sse(chunk({"content": "abc"}), chunk({}, "length"))) + egress.finish()
    events = parse_stream(data)
    assert events[-1].type == "response.incomplete"
    final = events[-1].response
    assert final.status == "incomplete" and final.incomplete_details.reason == "max_output_tokens"
    assert final.output[0].status == "incomplete" and final.output_text == "abc"


def test_parallel_calls_keep_their_output_indexes() -> None:
    req = translate(input="x", tools=[WEATHER], stream=True)
    egress = ResponsesEgress(req, 0)
    call = {"type": "function", "function": {"name": "get_weather", "arguments": ""}}
    data = (
        egress.events(
            sse(
                chunk(
                    {
                        "tool_calls": [
                            {"index": 0, "id": "a", **call},
                            {"index": 1, "id": "b", **call},
                        ]
                    }
                ),
                chunk({"tool_calls": [{"index": 1, "function": {"arguments": '{"city":"Rome"}'}}]}),
                chunk({"tool_calls": [{"index": 0, "function": {"arguments": '{"city":"Oslo"}'}}]}),
                chunk({}, "tool_calls"),
            )
        )
        + egress.finish()
    )
    events = parse_stream(data)
    final = events[-1].response
    assert [(o.call_id, o.arguments) for o in final.output] == [
        ("a", '{"city":"Oslo"}'),
        ("b", '{"city":"Rome"}'),
    ]
    done = [e for e in events if e.type == "response.output_item.done"]
    assert [e.output_index for e in done] == [0, 1]


def entry(token: str, logprob: float) -> dict[str, Any]:
    alternative = {"token": token, "logprob": logprob, "bytes": list(token.encode())}
    return {**alternative, "top_logprobs": [alternative]}


@pytest.mark.parametrize(
    ("body", "asked"),
    [
        ({"top_logprobs": 3}, 3),
        ({"include": ["message.output_text.logprobs"]}, 0),
        ({"include": ["reasoning.encrypted_content"]}, None),
        ({}, None),
    ],
)
def test_top_logprobs_and_the_logprobs_include_ask_the_lane_for_them(
    body: dict[str, Any], asked: int | None
) -> None:
    out = translate(input="Hi", **body).openai
    if asked is None:
        assert "logprobs" not in out and "top_logprobs" not in out
    else:
        assert (out["logprobs"], out["top_logprobs"]) == (True, asked)


@pytest.mark.parametrize("top", [21, -1, "3", True])
def test_top_logprobs_outside_openais_range_is_a_400(top: object) -> None:
    with pytest.raises(RouterError) as refused:
        translate(input="Hi", top_logprobs=top)
    assert refused.value.status == 400 and refused.value.param == "top_logprobs"


def test_the_answers_logprobs_reach_its_output_text_whole_and_streamed() -> None:
    req = translate(input="Hi", top_logprobs=1)
    whole = chat_answer("ab")
    whole["choices"][0]["logprobs"] = {"content": [entry("a", -0.1), entry("b", -0.2)]}
    response = RESPONSE.validate_python(orjson.loads(ResponsesEgress(req, 0).body(whole)))
    part = response.output[0].content[0]  # type: ignore[union-attr]
    assert part.type == "output_text" and part.logprobs is not None
    assert [(e.token, e.logprob) for e in part.logprobs] == [("a", -0.1), ("b", -0.2)]
    assert part.logprobs[0].top_logprobs[0].token == "a"

    streamed = translate(input="Hi", top_logprobs=1, stream=True)
    egress = ResponsesEgress(streamed, 0)

    def with_logprobs(delta: dict[str, Any], *entries: dict[str, Any]) -> dict[str, Any]:
        event = chunk(delta)
        event["choices"][0]["logprobs"] = {"content": list(entries)}
        return event

    upstream = sse(
        chunk({"role": "assistant", "content": ""}),
        with_logprobs({"content": "a"}, entry("a", -0.1)),
        with_logprobs({}, entry("b", -0.2)),  # entries that came with no text: the last ones
        chunk({}, "stop"),
    )
    events = parse_stream(egress.events(upstream) + egress.finish())
    deltas = [e for e in events if e.type == "response.output_text.delta"]
    assert [[x.token for x in d.logprobs] for d in deltas] == [["a"]]
    (done,) = [e for e in events if e.type == "response.output_text.done"]
    assert [x.token for x in done.logprobs] == ["a", "b"]
    final = events[-1].response
    assert [x.token for x in final.output[0].content[0].logprobs] == ["a", "b"]
