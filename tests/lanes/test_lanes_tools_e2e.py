"""Tool calls through the router to its real lanes, with the official openai client.

The router relays tool calls untouched; this checks the whole path a coding agent uses: a
streamed forced call on each lane, usage once per stream.
"""

from __future__ import annotations

import json
from typing import Any

import pytest

from router.lanes.modelprep import DEFAULT_MODEL_NAME
from tests.realmodel import Router

pytestmark = pytest.mark.realmodel

READ = {
    "type": "function",
    "function": {
        "name": "read",
        "description": "Read a file",
        "parameters": {
            "type": "object",
            "properties": {"path": {"type": "string", "maxLength": 30}},
            "required": ["path"],
        },
    },
}
# An agent-shaped user turn: content as an array of parts.
ASK = [
    {
        "role": "user",
        "content": [
            {"type": "text", "text": "Show me "},
            {"type": "text", "text": "the file README.md"},
        ],
    }
]


@pytest.fixture
def router(real_lanes_router: Router) -> Router:
    return real_lanes_router


@pytest.mark.parametrize("lane", ["speculative", "batching"])
def test_a_streamed_forced_tool_call_through_the_router(router: Router, lane: str) -> None:
    stream = router.client().chat.completions.create(
        model=DEFAULT_MODEL_NAME,
        messages=ASK,
        tools=[READ],  # type: ignore[arg-type,list-item]
        tool_choice="required",
        max_tokens=40,
        stream=True,
        stream_options={"include_usage": True},
        extra_headers={"X-Speclane-Lane": lane},
    )
    chunks = list(stream)
    deltas = [d for c in chunks if c.choices for d in c.choices[0].delta.tool_calls or []]
    assert deltas and deltas[0].function is not None and deltas[0].function.name == "read"
    arguments = "".join(d.function.arguments or "" for d in deltas if d.function)
    assert isinstance(json.loads(arguments)["path"], str)
    reasons = [c.choices[0].finish_reason for c in chunks if c.choices]
    assert reasons[-1] == "tool_calls"
    assert [c for c in chunks if c.usage is not None] == [chunks[-1]]


def test_a_constrained_answer_drafts_forced_tokens_and_writes_the_plain_answer(
    router: Router,
) -> None:
    """The router sends a required call and a json_schema answer to either lane with a free
    source between the grammar's forced tokens; both lanes draft them and write the same
    answer (greedy)."""
    person = {
        "type": "object",
        "properties": {"name": {"type": "string"}, "age": {"type": "integer"}},
        "required": ["name", "age"],
    }
    cases: list[dict[str, Any]] = [
        {"tools": [READ], "tool_choice": {"type": "function", "function": {"name": "read"}}},
        {
            "response_format": {
                "type": "json_schema",
                "json_schema": {"name": "person", "schema": person},
            }
        },
    ]
    for extra in cases:
        answers = {}
        for lane in ("speculative", "batching"):
            resp = router.client().chat.completions.create(
                model=DEFAULT_MODEL_NAME,
                messages=ASK,
                max_tokens=40,
                temperature=0,
                extra_headers={"X-Speclane-Lane": lane},
                **extra,
            )
            message = resp.choices[0].message
            calls = [(c.function.name, c.function.arguments) for c in message.tool_calls or []]
            answers[lane] = (message.content, calls)
            usage = resp.model_dump()["usage"]
            spec = usage["speclane_spec"]
            # auto: the forced runs, with a free source filling between them
            assert spec["source"] == "auto" and spec["forced"] > 0, (lane, spec)
            assert spec["accepted"] >= spec["forced"]
        assert answers["speculative"] == answers["batching"], extra
