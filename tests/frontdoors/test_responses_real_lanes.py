"""The Responses API in front of the real MLX lanes, through the official openai SDK (slow,
serial; few tokens): text streaming and not, a forced function call and its output sent back
once through previous_response_id and once as the whole input, a JSON-schema answer."""

from __future__ import annotations

from typing import Any

import orjson
import pytest

from router.lanes.modelprep import DEFAULT_MODEL_NAME
from tests.conftest import metric_value
from tests.realmodel import Router

pytestmark = pytest.mark.realmodel

QUESTION = "What is the capital of France?"
WEATHER: Any = {
    "type": "function",
    "name": "get_weather",
    "strict": True,
    "description": "The current weather in a city",
    "parameters": {
        "type": "object",
        "properties": {"city": {"type": "string"}},
        "required": ["city"],
        "additionalProperties": False,
    },
}
FINAL = ("response.completed", "response.incomplete")


@pytest.fixture
def router(real_lanes_router: Router) -> Router:
    return real_lanes_router


def final_of(events: list[Any]) -> Any:
    """The response of a stream's last event (incomplete when the token limit cut it)."""
    assert events[-1].type in FINAL, [e.type for e in events]
    assert [e.sequence_number for e in events] == list(range(len(events)))
    return events[-1].response


@pytest.mark.parametrize("lane", ["speculative", "batching"])
def test_text_streaming_and_not(router: Router, lane: str) -> None:
    kwargs: Any = {
        "model": DEFAULT_MODEL_NAME,
        "input": QUESTION,
        "max_output_tokens": 12,
        "temperature": 0,
        "extra_headers": {"X-Speclane-Lane": lane},
    }
    answered = {"api": "responses", "backend": lane, "status": "200"}
    before = metric_value(router.metrics(), "speclane_requests_total", **answered) or 0
    client = router.client()
    raw = client.responses.with_raw_response.create(**kwargs)
    whole = raw.parse()
    with client.responses.stream(**kwargs) as stream:
        streamed = final_of(list(stream))
    assert raw.headers["x-speclane-lane"] == lane
    assert "Paris" in whole.output_text and streamed.output_text == whole.output_text
    assert whole.usage is not None and streamed.usage is not None
    assert whole.usage.output_tokens > 0
    assert streamed.usage.input_tokens == whole.usage.input_tokens > 0
    assert metric_value(router.metrics(), "speclane_requests_total", **answered) == before + 2


@pytest.mark.parametrize("stream", [False, True], ids=["json", "stream"])
def test_function_call_round_trip(router: Router, stream: bool) -> None:
    client = router.client()
    ask: Any = [{"role": "user", "content": "What is the weather in Paris?"}]
    kwargs: Any = {
        "model": DEFAULT_MODEL_NAME,
        "tools": [WEATHER],
        "temperature": 0,
        "max_output_tokens": 40,
    }
    if stream:
        with client.responses.stream(
            input=ask, tool_choice={"type": "function", "name": "get_weather"}, **kwargs
        ) as s:
            called = final_of(list(s))
    else:
        called = client.responses.create(
            input=ask, tool_choice={"type": "function", "name": "get_weather"}, **kwargs
        )
    calls = [o for o in called.output if o.type == "function_call"]
    assert len(calls) == 1 and calls[0].name == "get_weather", called
    assert isinstance(orjson.loads(calls[0].arguments).get("city"), str)
    result: Any = {
        "type": "function_call_output",
        "call_id": calls[0].call_id,
        "output": "Sunny, 21 degrees",
    }
    kwargs["max_output_tokens"] = 12
    chained = client.responses.create(previous_response_id=called.id, input=[result], **kwargs)
    replayed = client.responses.create(
        input=[*ask, *[o.model_dump(exclude_none=True) for o in called.output], result], **kwargs
    )
    # The same conversation either way: the same prompt, the same greedy answer.
    assert chained.usage is not None and replayed.usage is not None
    assert called.usage is not None
    assert chained.usage.input_tokens == replayed.usage.input_tokens > called.usage.input_tokens
    assert chained.output_text == replayed.output_text
    assert chained.status in ("completed", "incomplete")


def test_json_schema_answer(router: Router) -> None:
    schema = {
        "type": "object",
        "properties": {"capital": {"type": "string"}},
        "required": ["capital"],
        "additionalProperties": False,
    }
    response = router.client().responses.create(
        model=DEFAULT_MODEL_NAME,
        input=QUESTION + " Answer in JSON.",
        temperature=0,
        max_output_tokens=24,
        text={
            "format": {"type": "json_schema", "name": "answer", "schema": schema, "strict": True}
        },
    )
    assert response.status == "completed", response
    assert isinstance(orjson.loads(response.output_text)["capital"], str)
