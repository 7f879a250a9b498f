from __future__ import annotations

from typing import Any

import pytest

from router.errors import RouterError
from router.worker.protocol import (
    DEFAULT_MAX_TOKENS,
    DEFAULT_TEMPERATURE,
    MAX_DRAFT_TOKENS,
    Message,
    parse_request,
)

CHAT = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}


def chat(**fields: Any) -> dict[str, Any]:
    return {**CHAT, **fields}


def rejected(body: Any, kind: str = "chat") -> RouterError:
    with pytest.raises(RouterError) as info:
        parse_request(body, kind)  # type: ignore[arg-type]
    assert info.value.status == 400
    assert info.value.type == "invalid_request_error"
    return info.value


def test_defaults() -> None:
    req = parse_request(CHAT, "chat")
    assert req.messages == (Message("user", "hi"),)
    assert req.max_tokens == DEFAULT_MAX_TOKENS
    assert req.temperature == DEFAULT_TEMPERATURE
    assert (req.stop, req.seed, req.stream, req.include_usage) == ((), None, False, False)
    assert req.num_draft_tokens is None


def test_all_fields() -> None:
    req = parse_request(
        chat(
            temperature=0.7, top_p=0.9, top_k=40, min_p=0.05, max_tokens=12, stop=["a", "bc"],
            seed=7, stream=True, stream_options={"include_usage": True}, num_draft_tokens=2,
            presence_penalty=0.5, logit_bias={"42": -100},
        ),
        "chat",
    )
    assert (req.temperature, req.top_p, req.top_k, req.min_p) == (0.7, 0.9, 40, 0.05)
    assert (req.max_tokens, req.stop, req.seed) == (12, ("a", "bc"), 7)
    assert (req.stream, req.include_usage, req.num_draft_tokens) == (True, True, 2)
    assert req.presence_penalty == 0.5
    assert req.logit_bias == ((42, -100.0),)


def test_a_single_stop_string_and_max_completion_tokens() -> None:
    req = parse_request(chat(stop="\n", max_completion_tokens=9, max_tokens=99), "chat")
    assert req.stop == ("\n",)
    assert req.max_tokens == 9


def test_text_parts_are_joined() -> None:
    content = [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]
    req = parse_request(chat(messages=[{"role": "user", "content": content}]), "chat")
    assert req.messages[0].content == "ab"


@pytest.mark.parametrize(
    ("fields", "param"),
    [
        ({"max_tokens": 0}, "max_tokens"),
        ({"max_tokens": True}, "max_tokens"),
        ({"max_tokens": "5"}, "max_tokens"),
        ({"temperature": -0.1}, "temperature"),
        ({"temperature": "hot"}, "temperature"),
        ({"top_p": 1.5}, "top_p"),
        ({"top_k": -1}, "top_k"),
        ({"stop": ""}, "stop"),
        ({"stop": [1]}, "stop"),
        ({"stop": ["x"] * 17}, "stop"),
        ({"seed": 1.5}, "seed"),
        ({"stream": "yes"}, "stream"),
        ({"num_draft_tokens": -1}, "num_draft_tokens"),
        ({"num_draft_tokens": MAX_DRAFT_TOKENS + 1}, "num_draft_tokens"),
        ({"n": 2}, "n"),
        ({"messages": []}, "messages"),
        ({"messages": [{"content": "no role"}]}, "messages"),
        ({"messages": [{"role": "user", "content": [{"type": "image_url"}]}]}, "messages"),
        ({"logit_bias": {"x": 1}}, "logit_bias"),
        ({"logit_bias": {"1": 101}}, "logit_bias"),
        ({"model": 3}, "model"),
    ],
)
def test_bad_fields_name_the_parameter(fields: dict[str, Any], param: str) -> None:
    assert rejected(chat(**fields)).param == param


def test_the_body_must_be_an_object() -> None:
    rejected([1, 2])


@pytest.mark.parametrize(
    ("prompt", "expected"),
    [("hello", "hello"), (["hello"], "hello"), ([1, 2, 3], (1, 2, 3)), ([[4, 5]], (4, 5))],
)
def test_completion_prompts(prompt: Any, expected: Any) -> None:
    assert parse_request({"prompt": prompt}, "completion").prompt == expected


@pytest.mark.parametrize("prompt", [None, "", [], ["a", "b"], [1, -2], [True], {"a": 1}])
def test_bad_completion_prompts(prompt: Any) -> None:
    assert rejected({"prompt": prompt}, "completion").param == "prompt"


@pytest.mark.parametrize(
    ("prediction", "expected"),
    [
        (None, None),
        ({"type": "content", "content": "def f():\n    pass\n"}, "def f():\n    pass\n"),
        ({"type": "content", "content": [{"type": "text", "text": "a"},
                                         {"type": "text", "text": "b"}]}, "ab"),
        ({"type": "content", "content": ""}, None),  # nothing to draft from
    ],
)
def test_predicted_outputs_are_read(prediction: Any, expected: str | None) -> None:
    assert parse_request(chat(prediction=prediction), "chat").prediction == expected


@pytest.mark.parametrize(
    "prediction",
    [
        "text",
        {"type": "text", "content": "x"},
        {"type": "content", "content": 3},
        {"type": "content", "content": [{"type": "image_url", "image_url": "x"}]},
        {"type": "content", "content": [{"type": "text", "text": None}]},
    ],
)
def test_malformed_predictions_are_a_400_naming_the_parameter(prediction: Any) -> None:
    assert rejected(chat(prediction=prediction)).param == "prediction"
