"""router.request_rules: one wording per fault of an OpenAI request field, the same from
the router (router.proxy.request) and from the lane worker (router.worker.request.protocol)."""

from __future__ import annotations

from typing import Any

import orjson
import pytest

from router.errors import RouterError
from router.proxy.request import parse_request as router_parse
from router.request_rules import (
    MAX_JSON_DEPTH,
    ORJSON_MAX_DEPTH,
    integer,
    number,
    too_deep,
    typed,
)
from router.worker.request.protocol import parse_request as worker_parse

CHAT = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}


def fault(parse: Any) -> tuple[str, str | None]:
    with pytest.raises(RouterError) as info:
        parse()
    assert info.value.status == 400
    return info.value.message, info.value.param


@pytest.mark.parametrize(
    ("field", "value", "message"),
    [
        ("n", "2", "'n' must be of type integer"),
        ("n", True, "'n' must be of type integer"),
        ("n", 1.5, "'n' must be of type integer"),
        ("stream", "yes", "'stream' must be of type boolean"),
        ("stream_options", [], "'stream_options' must be of type object"),
        ("temperature", "hot", "'temperature' must be of type number"),
        ("temperature", True, "'temperature' must be of type number"),
        ("temperature", 3, "'temperature' must be between 0 and 2"),
        ("temperature", -0.5, "'temperature' must be between 0 and 2"),
        ("max_tokens", "9", "'max_tokens' must be of type integer"),
        ("max_completion_tokens", False, "'max_completion_tokens' must be of type integer"),
        ("logprobs", 3, "'logprobs' must be of type boolean"),
        ("top_logprobs", 21, "'top_logprobs' must be between 0 and 20"),
        ("top_logprobs", 2, "'top_logprobs' needs 'logprobs' to be true"),
    ],
)
def test_router_and_worker_word_a_fault_alike(field: str, value: Any, message: str) -> None:
    body = {**CHAT, field: value}
    assert fault(lambda: router_parse("chat", orjson.dumps(body))) == (message, field)
    assert fault(lambda: worker_parse(body, "chat")) == (message, field)


def test_ranges() -> None:
    data = {"a": 0, "b": 2.5, "c": 10**6 + 1}
    assert integer(data, "a", None, 0, None) == 0
    assert integer(data, "missing", 7, 0, 9) == 7
    assert number(data, "b", None, 0, 2.5) == 2.5
    assert fault(lambda: integer(data, "a", None, 1, None)) == ("'a' must be at least 1", "a")
    assert fault(lambda: integer(data, "c", None, 1, 10**6)) == (
        "'c' must be between 1 and 1000000",
        "c",
    )
    assert fault(lambda: number(data, "b", None, 0.0, 2.0)) == ("'b' must be between 0 and 2", "b")


def test_null_is_absent() -> None:
    assert typed({"k": None}, "k", str, "default") == "default"


def test_the_other_front_doors_word_a_type_fault_alike() -> None:
    from router.frontdoors.anthropic_in import to_openai
    from router.frontdoors.ollama_in import chat_to_openai

    anthropic = {"model": "m", "max_tokens": 5, "messages": [{"role": "user", "content": "hi"}]}
    assert fault(lambda: to_openai({**anthropic, "top_k": 1.5})) == (
        "'top_k' must be of type integer",
        "top_k",
    )
    assert fault(lambda: to_openai({**anthropic, "temperature": "hot"})) == (
        "'temperature' must be of type number",
        "temperature",
    )
    ollama = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}
    assert fault(lambda: chat_to_openai({**ollama, "options": {"num_ctx": 1.5}})) == (
        "'options.num_ctx' must be of type integer",
        "options.num_ctx",
    )


def nested(levels: int, kind: type = list) -> Any:
    value: Any = 1
    for _ in range(levels):
        value = [value] if kind is list else {"a": value}
    return value


@pytest.mark.parametrize("kind", [list, dict])
def test_the_depth_rule_counts_arrays_and_objects(kind: type) -> None:
    assert not too_deep(nested(MAX_JSON_DEPTH, kind))
    assert too_deep(nested(MAX_JSON_DEPTH + 1, kind))
    assert too_deep(nested(1000, kind))  # orjson reads up to 1,024
    assert not too_deep("x") and not too_deep({}) and not too_deep([[], {"a": [1, 2]}])
    wide = [nested(MAX_JSON_DEPTH - 1, kind) for _ in range(1000)]
    assert not too_deep(wide) and too_deep([*wide, nested(MAX_JSON_DEPTH, kind)])


def test_orjson_writes_the_depth_the_rule_relies_on() -> None:
    """too_deep asks orjson, whose encoder stops at ORJSON_MAX_DEPTH levels: a new orjson
    that moved it would turn the rule wrong, and fails here."""
    orjson.dumps(nested(ORJSON_MAX_DEPTH))
    with pytest.raises(orjson.JSONEncodeError):
        orjson.dumps(nested(ORJSON_MAX_DEPTH + 1))
    assert ORJSON_MAX_DEPTH - MAX_JSON_DEPTH >= 8  # room for what the doors wrap around


def test_router_bodies_past_the_rule_are_a_400_before_any_field_check() -> None:
    raw = orjson.dumps({"model": "m", "messages": "not a list", "x": nested(MAX_JSON_DEPTH)})
    message, _ = fault(lambda: router_parse("chat", raw))
    assert "more than 128 levels deep" in message


@pytest.mark.parametrize(
    ("value", "message"),
    [(6, "'logprobs' must be between 0 and 5"), (True, "'logprobs' must be of type integer")],
)
def test_completions_logprobs_keep_openais_range_in_both_programs(value: Any, message: str) -> None:
    body = {"model": "m", "prompt": "x", "logprobs": value}
    assert fault(lambda: router_parse("completions", orjson.dumps(body))) == (message, "logprobs")
    assert fault(lambda: worker_parse(body, "completion")) == (message, "logprobs")


def test_logprobs_within_openais_ranges_pass() -> None:
    chat = {**CHAT, "logprobs": True, "top_logprobs": 20}
    router_parse("chat", orjson.dumps(chat))
    assert worker_parse(chat, "chat").logprobs == 20
    assert worker_parse({**CHAT, "logprobs": True}, "chat").logprobs == 0
    assert worker_parse({**CHAT, "logprobs": False}, "chat").logprobs is None
    assert worker_parse({"prompt": "x", "logprobs": 5}, "completion").logprobs == 5
