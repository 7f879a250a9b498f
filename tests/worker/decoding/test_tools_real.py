"""Tool calls and structured output with the official client against the real workers.

The default model's chat template has no tools section, so these go through the fallback
convention; forced calls and JSON answers are constrained (llguidance). Short generations,
run serially.
"""

from __future__ import annotations

import json
from typing import Any

import openai
import pytest

from router.lanes.modelprep import DEFAULT_MODEL_NAME
from tests.worker.conftest import WorkerProcess
from tests.worker.decoding.test_constrain import REJECTED

pytestmark = pytest.mark.realmodel

WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Get the current weather in a city",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string", "maxLength": 20}},
            "required": ["city"],
        },
    },
}
QUESTION = [{"role": "user", "content": "What is the weather in Paris?"}]


def client(worker: WorkerProcess) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{worker.url}/v1", api_key="x", max_retries=0, timeout=240)


def result_turn(call_id: str) -> dict[str, Any]:
    return {"role": "tool", "tool_call_id": call_id, "content": '{"sky": "sunny", "c": 21}'}


def test_round_trip_on_the_batching_lane(batch_worker: WorkerProcess) -> None:
    c = client(batch_worker)
    first = c.chat.completions.create(
        model=DEFAULT_MODEL_NAME,
        messages=QUESTION,
        tools=[WEATHER],  # type: ignore[list-item]
        tool_choice="required",
        max_tokens=40,
    )
    choice = first.choices[0]
    assert choice.finish_reason == "tool_calls", choice
    assert choice.message.tool_calls is not None and len(choice.message.tool_calls) == 1
    call = choice.message.tool_calls[0]
    assert call.function.name == "get_weather"
    assert isinstance(json.loads(call.function.arguments)["city"], str)
    assistant = choice.message.model_dump(exclude_none=True)
    final = c.chat.completions.create(
        model=DEFAULT_MODEL_NAME,
        messages=[*QUESTION, assistant, result_turn(call.id)],  # type: ignore[list-item]
        tools=[WEATHER],  # type: ignore[list-item]
        max_tokens=12,
    )
    # The result went into the prompt: the second prompt is longer than the first by more
    # than the call itself.
    assert final.usage is not None and first.usage is not None
    assert final.usage.prompt_tokens > first.usage.prompt_tokens + first.usage.completion_tokens
    answer = final.choices[0]
    assert answer.message.tool_calls is None
    assert answer.message.content
    assert answer.finish_reason in ("stop", "length")


def test_streamed_round_trip_on_the_speculative_lane(spec_worker: WorkerProcess) -> None:
    c = client(spec_worker)
    named = {"type": "function", "function": {"name": "get_weather"}}
    stream = c.chat.completions.create(
        model=DEFAULT_MODEL_NAME,
        messages=QUESTION,
        tools=[WEATHER],  # type: ignore[list-item]
        tool_choice=named,
        max_tokens=40,
        stream=True,  # type: ignore[arg-type]
        stream_options={"include_usage": True},
    )
    chunks = list(stream)
    deltas = [d for ch in chunks if ch.choices for d in ch.choices[0].delta.tool_calls or []]
    assert deltas and deltas[0].id and deltas[0].function and deltas[0].function.name
    assert deltas[0].function.name == "get_weather"
    arguments = "".join(d.function.arguments or "" for d in deltas if d.function)
    assert isinstance(json.loads(arguments)["city"], str)
    reasons = [ch.choices[0].finish_reason for ch in chunks if ch.choices]
    assert reasons[-1] == "tool_calls"
    usage = [ch.usage for ch in chunks if ch.usage is not None]
    assert len(usage) == 1 and chunks[-1].usage is not None
    # Constrained decoding drafts the grammar's forced tokens on the speculative lane (the
    # marker, the named function, the keys).
    spec = chunks[-1].usage.model_extra["speclane_spec"]
    assert spec["forced"] > 0 and spec["accepted"] >= spec["forced"]
    assistant = {
        "role": "assistant",
        "content": None,
        "tool_calls": [
            {
                "id": deltas[0].id,
                "type": "function",
                "function": {"name": "get_weather", "arguments": arguments},
            }
        ],
    }
    final = c.chat.completions.create(
        model=DEFAULT_MODEL_NAME,
        messages=[*QUESTION, assistant, result_turn(deltas[0].id)],  # type: ignore[list-item]
        tools=[WEATHER],  # type: ignore[list-item]
        max_tokens=12,
        stream=True,
    )
    parts = list(final)
    text = "".join(p.choices[0].delta.content or "" for p in parts if p.choices)
    assert text
    assert not any(p.choices[0].delta.tool_calls for p in parts if p.choices)


def test_streamed_arguments_come_token_by_token_and_match_the_answer(
    batch_worker: WorkerProcess,
) -> None:
    c = client(batch_worker)
    ask: dict[str, Any] = {
        "model": DEFAULT_MODEL_NAME,
        "messages": QUESTION,
        "tools": [WEATHER],
        "tool_choice": {"type": "function", "function": {"name": "get_weather"}},
        "max_tokens": 40,
        "temperature": 0.0,
    }
    chunks = list(c.chat.completions.create(stream=True, **ask))
    deltas = [d for ch in chunks if ch.choices for d in ch.choices[0].delta.tool_calls or []]
    head, fragments = deltas[0], deltas[1:]
    assert head.id and head.function and head.function.name == "get_weather"
    assert head.function.arguments == ""
    texts = [d.function.arguments for d in fragments if d.function and d.function.arguments]
    # Whole calls used to go out in 32-character pieces: arguments this short came in one.
    # Here each token's text is its own fragment, sent as the model wrote it.
    assert len(texts) == len(fragments) > 1, texts
    assert all(d.index == 0 and d.id is None for d in fragments)
    streamed = json.loads("".join(texts))
    assert chunks[-1].choices[0].finish_reason == "tool_calls", "|".join(texts)
    whole = c.chat.completions.create(**ask).choices[0]
    assert whole.finish_reason == "tool_calls" and whole.message.tool_calls is not None
    (call,) = whole.message.tool_calls
    assert call.function.name == "get_weather"
    assert streamed == json.loads(call.function.arguments)  # the same greedy call


@pytest.mark.parametrize("seed", [1, 2])
def test_json_schema_answers_are_well_formed(batch_worker: WorkerProcess, seed: int) -> None:
    schema = {
        "type": "object",
        "properties": {
            "city": {"type": "string", "maxLength": 20},
            "sunny": {"type": "boolean"},
        },
        "required": ["city", "sunny"],
    }
    reply = client(batch_worker).chat.completions.create(
        model=DEFAULT_MODEL_NAME,
        messages=QUESTION,
        max_tokens=40,  # type: ignore[arg-type]
        temperature=1.0,
        seed=seed,
        response_format={"type": "json_schema", "json_schema": {"name": "w", "schema": schema}},
    )
    content = reply.choices[0].message.content
    assert reply.choices[0].finish_reason == "stop", content
    answer = json.loads(content or "")
    assert set(answer) == {"city", "sunny"}
    assert isinstance(answer["sunny"], bool) and len(answer["city"]) <= 20


@pytest.mark.parametrize(
    ("fields", "param"),
    [
        (
            {"tools": [WEATHER], "tool_choice": {"type": "function", "function": {"name": "nope"}}},
            "tool_choice",
        ),
        *REJECTED,  # what the constraint library rejects
    ],
)
def test_what_cannot_be_honoured_is_a_400_naming_the_parameter(
    batch_worker: WorkerProcess, fields: dict[str, Any], param: str
) -> None:
    with pytest.raises(openai.BadRequestError) as info:
        client(batch_worker).chat.completions.create(
            model=DEFAULT_MODEL_NAME, messages=QUESTION, max_tokens=5, **fields
        )
    assert info.value.response.json()["error"]["param"] == param


@pytest.mark.parametrize("lane", ["batching", "speculative"])
@pytest.mark.parametrize("stream", [False, True], ids=["json", "stream"])
def test_a_schema_failing_mid_answer_ends_with_an_error_never_a_stop(
    request: pytest.FixtureRequest, lane: str, stream: bool
) -> None:
    """LATE_FAILURE passes the probe; a bias towards '"' makes the model close the free
    string at once and reach the key where the matcher fails."""
    from mlx_lm.tokenizer_utils import load

    from tests.worker.decoding.test_constrain import LATE_FAILURE

    worker: WorkerProcess = request.getfixturevalue(
        "batch_worker" if lane == "batching" else "spec_worker"
    )
    tokenizer = load(request.getfixturevalue("prepared_models")[0])
    (quote,) = tokenizer.encode('"', add_special_tokens=False)
    fields: dict[str, Any] = {
        "response_format": {
            "type": "json_schema",
            "json_schema": {"name": "late", "schema": LATE_FAILURE},
        },
        "logit_bias": {str(quote): 100},
        "max_tokens": 30,
        "temperature": 0,
    }
    c = client(worker)
    if not stream:
        with pytest.raises(openai.BadRequestError) as refused:
            c.chat.completions.create(model=DEFAULT_MODEL_NAME, messages=QUESTION, **fields)
        assert refused.value.code == "constraint_failed"
        assert refused.value.param == "response_format"
        return
    text, reasons = "", []
    with pytest.raises(openai.APIError) as broken:
        for chunk in c.chat.completions.create(
            model=DEFAULT_MODEL_NAME, messages=QUESTION, stream=True, **fields
        ):
            if chunk.choices:
                text += chunk.choices[0].delta.content or ""
                reasons.append(chunk.choices[0].finish_reason)
    assert "constraint library failed" in broken.value.message
    assert text.startswith('{"s": ""') and reasons[-1] is None  # no "stop" was sent
