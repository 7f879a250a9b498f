from __future__ import annotations

import orjson
import pytest

from router.kernel.errors import RouterError
from router.proxy.request import parse_request


def test_the_forwarded_body_is_what_was_parsed() -> None:
    raw = b'{"model":"m",  "messages":[{"role":"user","content":"hi"}], "x_custom": 1}'
    parsed = parse_request("chat", raw)
    assert orjson.loads(parsed.body()) == orjson.loads(raw)
    assert parsed.body() is parsed.body()  # encoded once
    parsed.set_field("model", "other")
    assert orjson.loads(parsed.body())["model"] == "other"


def test_duplicate_keys_are_forwarded_as_validated() -> None:
    """Whichever value a backend's parser would keep, it gets the one that was checked."""
    raw = (
        b'{"model":"m","max_tokens":1000000,"messages":[{"role":"user","content":"a",'
        b'"content":"b"}],"max_tokens":10,"model":"m"}'
    )
    parsed = parse_request("chat", raw)
    assert parsed.route.max_tokens == 10
    body = parsed.body()
    assert body.count(b"max_tokens") == 1 and body.count(b'"content"') == 1
    assert orjson.loads(body)["max_tokens"] == 10


def test_route_facts() -> None:
    raw = orjson.dumps(
        {
            "model": "m",
            "messages": [{"role": "user", "content": "abcd"}],
            "stream": True,
            "n": 2,
            "max_tokens": 9,
            "temperature": 1,
        }
    )
    route = parse_request("chat", raw).route
    assert (route.stream, route.n, route.max_tokens, route.temperature, route.prompt_chars) == (
        True,
        2,
        9,
        1.0,
        4,
    )


def test_both_token_limits_are_checked_and_kept_equal() -> None:
    raw = (
        b'{"model":"m","messages":[{"role":"user","content":"a"}],'
        b'"max_completion_tokens":10,"max_tokens":1000000}'
    )
    parsed = parse_request("chat", raw)
    assert parsed.route.max_tokens == 10
    assert orjson.loads(parsed.body())["max_tokens"] == 10
    parsed.set_field("max_completion_tokens", 5)  # a cap clamps one name: both follow
    body = orjson.loads(parsed.body())
    assert (body["max_tokens"], body["max_completion_tokens"]) == (5, 5)


def test_nesting_too_deep_to_forward_is_a_400() -> None:
    deep = b"[" * 300 + b"]" * 300
    raw = b'{"model":"m","messages":[{"role":"user","content":' + deep + b"}]}"
    with pytest.raises(RouterError) as info:
        parse_request("chat", raw)
    assert info.value.status == 400


def test_the_body_for_the_lane_carries_the_chosen_draft_source() -> None:
    raw = orjson.dumps({"model": "m", "messages": [{"role": "user", "content": "hi"}]})
    parsed = parse_request("chat", raw)
    assert parsed.route.draft_source is None
    asked = orjson.loads(parsed.body(draft_source="prompt_lookup"))
    assert asked["draft_source"] == "prompt_lookup" and "num_draft_tokens" not in asked
    plain = orjson.loads(parsed.body(plain=True, draft_source="prompt_lookup"))
    assert plain["num_draft_tokens"] == 0 and "draft_source" not in plain
    assert "draft_source" not in orjson.loads(parsed.body())  # other backends: as validated


@pytest.mark.parametrize(
    ("sent", "route"),
    [
        ("draft_model", "draft_model"),
        ("prompt_lookup", "prompt_lookup"),
        ("magic", None),
        (3, None),
    ],
)
def test_a_client_draft_source_is_forwarded_as_sent(sent: object, route: str | None) -> None:
    raw = orjson.dumps(
        {"model": "m", "messages": [{"role": "user", "content": "hi"}], "draft_source": sent}
    )
    parsed = parse_request("chat", raw)
    assert parsed.route.draft_source == route  # only a value the lane accepts picks the key
    assert orjson.loads(parsed.body(draft_source="prompt_lookup"))["draft_source"] == sent


@pytest.mark.parametrize("extra", [{}, {"num_draft_tokens": 3}, {"draft_source": "draft_model"}])
def test_a_field_added_for_the_lane_is_never_sent_twice(extra: dict[str, object]) -> None:
    data = {"model": "m", "messages": [{"role": "user", "content": "é \u2028 x"}], **extra}
    parsed = parse_request("chat", orjson.dumps(data))
    for body, key, value in (
        (parsed.body(plain=True), "num_draft_tokens", 0),
        (
            parsed.body(draft_source="prompt_lookup"),
            "draft_source",
            extra.get("draft_source", "prompt_lookup"),
        ),
    ):
        assert body.count(f'"{key}"'.encode()) == 1
        assert orjson.loads(body) == {**data, key: value}
    parsed.set_field("max_tokens", 5)  # a change after parsing reaches the variants too
    assert orjson.loads(parsed.body(plain=True))["max_tokens"] == 5
