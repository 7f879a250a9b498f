"""Grammars and the logits processor with the real llguidance and the default model's tokenizer.

No model runs: tokens are picked from random logits under the processor's mask, so whatever
the "model" prefers, the text must be well-formed.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import mlx.core as mx
import numpy as np
import pytest

from router.kernel.errors import RouterError
from router.worker.decoding.constrain import COMPILER, Constraint, closed, grammar_parts
from router.worker.decoding.tools import ToolStream, fallback_syntax
from router.worker.request.protocol import parse_generation_request

WEATHER_PARAMS = {
    "type": "object",
    "properties": {
        "city": {"type": "string", "maxLength": 12},
        "unit": {"enum": ["celsius", "fahrenheit"]},
    },
    "required": ["city", "unit"],
    "additionalProperties": False,
}
TOOLS = [
    {"type": "function", "function": {"name": "get_weather", "parameters": WEATHER_PARAMS}},
    {
        "type": "function",
        "function": {
            "name": "get_time",
            "parameters": {
                "type": "object",
                "properties": {"tz": {"enum": ["UTC", "CET"]}},
                "required": ["tz"],
            },
        },
    },
]
MESSAGES = [{"role": "user", "content": "hi"}]


@pytest.fixture(scope="module")
def tokenizer(prepared_models: tuple[Path, Path]) -> Any:
    from mlx_lm.tokenizer_utils import load

    return load(prepared_models[0])


def request(**fields: Any) -> Any:
    return parse_generation_request({"messages": MESSAGES, **fields}, "chat")


def walk(constraint: Constraint, tokenizer: Any, seed: int, limit: int = 200) -> tuple[str, bool]:
    """Decode with random logits under the constraint: (text, ended with EOS)."""
    processor = constraint.processor()
    rng = np.random.default_rng(seed)
    prompt = [1, 2, 3]
    out: list[int] = []
    width = len(tokenizer)
    for _ in range(limit):
        logits = mx.array(rng.standard_normal((1, width)).astype(np.float32))
        token = int(mx.argmax(processor(mx.array(prompt + out), logits), axis=-1).item())
        if token in tokenizer.eos_token_ids:
            return tokenizer.decode(out), True
        out.append(token)
    return tokenizer.decode(out), False


def test_free_decoding_has_no_grammar() -> None:
    assert grammar_parts(request()) == {}
    assert grammar_parts(request(tools=TOOLS)) == {}  # auto: the model may or may not call


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_required_tool_calls_are_well_formed(tokenizer: Any, seed: int) -> None:
    constraint = COMPILER.compile(request(tools=TOOLS, tool_choice="required"), tokenizer)
    assert constraint is not None
    text, ended = walk(constraint, tokenizer, seed)
    assert ended, text
    stream = ToolStream(fallback_syntax(), request(tools=TOOLS).tools)
    pieces = stream.feed(text) + stream.finish()
    assert pieces and all(not isinstance(p, str) for p in pieces), text
    assert 1 <= len(stream.calls) <= 2  # at most one call per tool
    for call in stream.calls:
        arguments = json.loads(call.arguments)
        if call.name == "get_weather":
            assert arguments["unit"] in ("celsius", "fahrenheit")
            assert len(arguments["city"]) <= 12
        else:
            assert call.name == "get_time" and arguments["tz"] in ("UTC", "CET")


def test_a_named_function_is_the_only_one_called(tokenizer: Any) -> None:
    named = {"type": "function", "function": {"name": "get_time"}}
    constraint = COMPILER.compile(request(tools=TOOLS, tool_choice=named), tokenizer)
    assert constraint is not None
    for seed in range(3):
        text, ended = walk(constraint, tokenizer, seed)
        stream = ToolStream(fallback_syntax(), request(tools=TOOLS).tools)
        stream.feed(text)
        stream.finish()
        assert ended and [c.name for c in stream.calls] == ["get_time"], text


@pytest.mark.parametrize("seed", [0, 1])
def test_json_schema_answers_match_the_schema(tokenizer: Any, seed: int) -> None:
    fmt = {"type": "json_schema", "json_schema": {"name": "w", "schema": WEATHER_PARAMS}}
    constraint = COMPILER.compile(request(response_format=fmt), tokenizer)
    assert constraint is not None
    text, ended = walk(constraint, tokenizer, seed)
    assert ended, text
    answer = json.loads(text)
    assert set(answer) == {"city", "unit"} and answer["unit"] in ("celsius", "fahrenheit")


def test_json_object_answers_are_objects(tokenizer: Any) -> None:
    constraint = COMPILER.compile(request(response_format={"type": "json_object"}), tokenizer)
    assert constraint is not None
    text, ended = walk(constraint, tokenizer, 3, limit=400)
    if ended:  # a free-form object may be long; when it ends, it is an object
        assert isinstance(json.loads(text), dict)
    else:
        assert text.startswith("{")


# 2,000 object shapes, each with one optional key.
MANY_SHAPES = [{"type": "object", "properties": {f"k{i}": {"type": "string"}}} for i in range(2000)]
# Fields the constraint library rejects, and the parameter a 400 names (also sent to a real
# lane by tests/worker/decoding/test_tools_real.py).
REJECTED: list[tuple[dict[str, Any], str]] = [
    (
        {
            "response_format": {
                "type": "json_schema",
                "json_schema": {
                    "name": "x",
                    "schema": {"type": "object", "properties": {"a": {"type": "strin"}}},
                },
            }
        },
        "response_format",
    ),
    (
        {
            "response_format": {
                "type": "json_schema",
                "json_schema": {
                    "name": "x",
                    "schema": {"type": "string", "pattern": "(?<=a)b"},
                },
            }
        },
        "response_format",
    ),
    (
        {
            "tools": [
                {
                    "type": "function",
                    "function": {
                        "name": "f",
                        "parameters": {"type": "object", "properties": {"a": {"type": "nope"}}},
                    },
                }
            ],
            "tool_choice": "required",
        },
        "tools",
    ),
    # Valid, but past the parser's items per row at the answer's first key: found by the
    # probe walk before the answer starts, not mid-answer.
    (
        {
            "response_format": {
                "type": "json_schema",
                "json_schema": {"name": "x", "schema": {"anyOf": MANY_SHAPES}},
            }
        },
        "response_format",
    ),
    (
        {
            "tools": [
                {
                    "type": "function",
                    "function": {"name": "f", "parameters": {"anyOf": MANY_SHAPES}},
                }
            ],
            "tool_choice": "required",
        },
        "tools",
    ),
]


@pytest.mark.parametrize(("fields", "param"), REJECTED)
def test_a_schema_the_library_rejects_is_a_400_naming_it(
    tokenizer: Any, fields: dict[str, Any], param: str
) -> None:
    with pytest.raises(RouterError) as info:
        COMPILER.compile(request(**fields), tokenizer)
    assert info.value.status == 400
    assert info.value.param == param
    assert "rejected the schema" in info.value.message


def test_objects_with_listed_properties_are_closed_but_data_is_not() -> None:
    schema = {
        "type": "object",
        "properties": {
            "properties": {"type": "object", "properties": {"a": {"type": "string"}}},
            "free": {"type": "object"},
            "fixed": {"const": {"properties": {}}},
        },
        "additionalProperties": True,
    }
    out = closed(schema)
    assert out["additionalProperties"] is True  # said explicitly: kept
    inner = out["properties"]
    assert inner["properties"]["additionalProperties"] is False
    assert "additionalProperties" not in inner["free"]  # no properties listed: any object
    assert inner["fixed"] == {"const": {"properties": {}}}


# Passes the probe (it is still writing the free string "s" when the walk ends) and fails
# once an answer reaches "x": the mid-answer failure the engine must report.
LATE_FAILURE = {
    "type": "object",
    "properties": {"s": {"type": "string"}, "x": {"anyOf": MANY_SHAPES}},
    "required": ["s", "x"],
}


def test_a_constraint_failing_mid_answer_closes_it_and_says_so_once(tokenizer: Any) -> None:
    fields = {
        "response_format": {
            "type": "json_schema",
            "json_schema": {"name": "x", "schema": LATE_FAILURE},
        }
    }
    constraint = COMPILER.compile(request(**fields), tokenizer)
    assert constraint is not None and constraint.param == "response_format"
    failures: list[str] = []
    processor = constraint.processor(failures.append)
    tokens = [1, 2, 3]  # a prompt
    logits = mx.zeros((1, len(tokenizer)))
    processor(mx.array(tokens), logits)
    for token in tokenizer.encode('{"s": "a", "x": {"', add_special_tokens=False):
        tokens.append(token)
        masked = processor(mx.array(tokens), logits)
    processor(mx.array(tokens), logits)  # asked again: reported once
    assert len(failures) == 1 and "items" in failures[0]
    allowed = np.flatnonzero(np.array(masked[0] > -np.inf))
    assert set(allowed.tolist()) == set(tokenizer.eos_token_ids)  # only the end is left
