"""router.kernel.request_rules: one wording per fault of an OpenAI request field, the same from
the router (router.proxy.request) and from the lane worker (router.worker.request.protocol)."""

from __future__ import annotations

from typing import Any

import orjson
import pytest

from router.kernel.errors import RouterError
from router.kernel.request_rules import (
    MAX_JSON_DEPTH,
    MAX_LOGIT_BIAS,
    ORJSON_MAX_DEPTH,
    ascii_int,
    integer,
    logit_bias,
    number,
    parse_ascii_int,
    seed,
    token_id,
    too_deep,
    typed,
)
from router.proxy.request import parse_request as router_parse
from router.worker.request.protocol import parse_generation_request as worker_parse

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


# --- token ids and seeds (issue #44 class 1: what reaches MLX is checked first) -------------


@pytest.mark.parametrize(
    "key", ["²", "³¹", "①", "٣", "1" * 5000, "12345678901", "", "-1", "+1", " 1"]
)
def test_a_token_id_is_ascii_digits_only(key: str) -> None:
    assert token_id(key) is None
    for parse in (
        lambda: router_parse("chat", orjson.dumps({**CHAT, "logit_bias": {key: 1}})),
        lambda: worker_parse({**CHAT, "logit_bias": {key: 1}}, "chat"),
    ):
        message, param = fault(parse)
        assert param == "logit_bias" and "decimal digits" in message


def test_logit_bias_rules() -> None:
    assert token_id("0") == 0 and token_id("9999999999") == 9999999999
    assert logit_bias({"logit_bias": {"7": -100, "8": 100, "9": 0.5}}) == (
        (7, -100.0),
        (8, 100.0),
        (9, 0.5),
    )
    for bad in ({"1": 100.5}, {"1": True}, {"1": "1"}, {"1": None}):
        assert fault(lambda bad=bad: logit_bias({"logit_bias": bad}))[1] == "logit_bias"
    many = {str(i): 1 for i in range(MAX_LOGIT_BIAS + 1)}
    message, _ = fault(lambda: logit_bias({"logit_bias": many}))
    assert f"at most {MAX_LOGIT_BIAS}" in message


@pytest.mark.parametrize("value", [-(2**63) - 1, 2**64, 10**400])
def test_a_seed_outside_64_bits_is_refused_by_both(value: int) -> None:
    body = {**CHAT, "seed": value}
    assert fault(lambda: seed(body))[1] == "seed"
    assert fault(lambda: worker_parse(body, "chat"))[1] == "seed"
    raw = orjson.dumps(CHAT)[:-1] + b',"seed":%d}' % value  # orjson writes 64 bits only
    # (orjson reads a 65-bit integer as a float, a longer one not at all: a 400 either way)
    assert fault(lambda: router_parse("chat", raw))[1] in ("seed", None)


def test_seeds_inside_64_bits_pass() -> None:
    for value in (-(2**63), -1, 0, 2**64 - 1):
        assert seed({"seed": value}) == value


# --- integers from text: one strict way ---------------------------------------------------


@pytest.mark.parametrize(
    "text",
    [
        *(
            "\u00b2",
            "\u00b3\u00b9",
            "\u2460",
            "\u0663",
            "\uff15",
            "\U0001d7d9",
        ),  # superscripts, circled, ...
        *("", " 1", "1 ", "+1", "-1", "1_0", "0x10", "1e2", "1.0", "\u0661\u0660"),
        *("0", "101", "0100", "9" * 5000, "1" * 4301),  # out of range, too many digits
    ],
)
def test_ascii_int_refuses_anything_but_a_few_ascii_digits(text: str) -> None:
    assert parse_ascii_int(text, 1, 100) is None
    assert fault(lambda: ascii_int(text, 1, 100, param="limit")) == (
        "'limit' must be an integer from 1 to 100",
        "limit",
    )


def test_ascii_int_takes_ascii_digits_in_range() -> None:
    assert [ascii_int(t, 1, 100, param="limit") for t in ("1", "100", "007", "42")] == [
        1,
        100,
        7,
        42,
    ]
    assert parse_ascii_int("65535", 0, 65535) == 65535 and parse_ascii_int("0", 0, 9) == 0
    with pytest.raises(ValueError, match="non-negative"):
        parse_ascii_int("1", -1, 5)


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
