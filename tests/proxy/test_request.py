from __future__ import annotations

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from router.errors import RouterError
from router.proxy.request import SSETail, looks_like_sse, parse_request


def test_the_forwarded_body_is_what_was_parsed() -> None:
    raw = b'{"model":"m",  "messages":[{"role":"user","content":"hi"}], "x_custom": 1}'
    parsed = parse_request("chat", raw)
    assert orjson.loads(parsed.body()) == orjson.loads(raw)
    assert parsed.body() is parsed.body()  # encoded once
    parsed.set_field("model", "other")
    assert orjson.loads(parsed.body())["model"] == "other"


def test_duplicate_keys_are_forwarded_as_validated() -> None:
    """Whichever value a backend's parser would keep, it gets the one that was checked."""
    raw = (b'{"model":"m","max_tokens":1000000,"messages":[{"role":"user","content":"a",'
           b'"content":"b"}],"max_tokens":10,"model":"m"}')
    parsed = parse_request("chat", raw)
    assert parsed.route.max_tokens == 10
    body = parsed.body()
    assert body.count(b"max_tokens") == 1 and body.count(b'"content"') == 1
    assert orjson.loads(body)["max_tokens"] == 10


def test_route_facts() -> None:
    raw = orjson.dumps({"model": "m", "messages": [{"role": "user", "content": "abcd"}],
                        "stream": True, "n": 2, "max_tokens": 9, "temperature": 1})
    route = parse_request("chat", raw).route
    assert (route.stream, route.n, route.max_tokens, route.temperature, route.prompt_chars) == (
        True, 2, 9, 1.0, 4)


def test_sse_tail_keeps_only_the_end_and_finds_done() -> None:
    tail = SSETail(limit=200)
    for i in range(100):
        tail.feed(b'data: {"i": %d}\n\n' % i)
    tail.feed(b'data: {"usage": {"completion_tokens": 3}}\n\ndata: [DONE]\n\n')
    events, bad = tail.last_events(2)
    assert events == [{"i": 99}, {"usage": {"completion_tokens": 3}}]
    assert bad == 0
    assert tail.saw_done()


def test_sse_tail_split_across_chunks_and_crlf() -> None:
    tail = SSETail()
    for piece in (b'data: {"a"', b': 1}\r\n\r\nda', b"ta: [DONE]\r\n\r\n"):
        tail.feed(piece)
    assert tail.last_events() == ([{"a": 1}], 0)
    assert tail.saw_done()


def test_sse_tail_counts_malformed_events() -> None:
    tail = SSETail()
    tail.feed(b"data: {broken\n\ndata: 5\n\n")
    assert tail.last_events() == ([], 2)
    assert not tail.saw_done()


def test_first_chunk_framing() -> None:
    assert looks_like_sse(b"data: {}\n\n")
    assert looks_like_sse(b": keep-alive\n\n")
    assert looks_like_sse(b"\nevent: x\n")
    assert not looks_like_sse(b"<html>")
    assert not looks_like_sse(b'{"choices": []}')


def test_sse_tail_reads_events_larger_than_its_first_window() -> None:
    big = b'{"content": "' + b"x" * 20_000 + b'"}'
    tail = SSETail()
    tail.feed(b"data: " + big + b"\n\n")
    tail.feed(b'data: {"usage": {"completion_tokens": 3}}\n\n')
    tail.feed(b"data: [DONE]\n\n")
    events, bad = tail.last_events(2)
    assert (events, bad) == ([orjson.loads(big), {"usage": {"completion_tokens": 3}}], 0)
    assert tail.saw_done()


def test_sse_tail_of_a_long_stream_returns_only_the_last_events() -> None:
    tail = SSETail()
    for i in range(5000):
        tail.feed(b'data: {"i": %d}\n\n' % i)
    tail.feed(b"data: [DONE]\n\n")
    assert tail.last_events(3) == ([{"i": 4997}, {"i": 4998}, {"i": 4999}], 0)
    assert tail.saw_done()


def test_sse_tail_passes_a_done_without_its_blank_line() -> None:
    tail = SSETail()
    tail.feed(b'data: {"a": 1}\n\ndata: [DONE]\n')
    assert tail.saw_done()
    assert tail.last_events() == ([{"a": 1}], 0)


def tail_payloads_by_split(buf: bytes, want: int) -> list[bytes]:
    """The straightforward reading the windowed tail must agree with: every event
    of the whole buffer, then the last ``want`` that have data."""
    from router.proxy.request import _payload

    events = buf.replace(b"\r\n", b"\n").split(b"\n\n")
    return [p for p in map(_payload, events) if p is not None][-want:]


sse_pieces = st.sampled_from([b"data: ", b"data:", b"{\"a\":1}", b"[DONE]", b"\n", b"\r\n",
                              b"\n\n", b": keep-alive", b"event: x", b"x" * 300, b" "])


@settings(max_examples=400, deadline=None)
@given(pieces=st.lists(sse_pieces, max_size=60), want=st.integers(1, 8))
def test_the_tail_window_reads_the_same_payloads_as_splitting_everything(
        pieces: list[bytes], want: int) -> None:
    from router.proxy.request import _tail_payloads

    buf = b"".join(pieces)
    assert _tail_payloads(bytearray(buf), want) == tail_payloads_by_split(buf, want)


def test_both_token_limits_are_checked_and_kept_equal() -> None:
    raw = (b'{"model":"m","messages":[{"role":"user","content":"a"}],'
           b'"max_completion_tokens":10,"max_tokens":1000000}')
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


@pytest.mark.parametrize(("sent", "route"), [
    ("draft_model", "draft_model"), ("prompt_lookup", "prompt_lookup"), ("magic", None), (3, None),
])
def test_a_client_draft_source_is_forwarded_as_sent(sent: object, route: str | None) -> None:
    raw = orjson.dumps({"model": "m", "messages": [{"role": "user", "content": "hi"}],
                        "draft_source": sent})
    parsed = parse_request("chat", raw)
    assert parsed.route.draft_source == route  # only a value the lane accepts picks the key
    assert orjson.loads(parsed.body(draft_source="prompt_lookup"))["draft_source"] == sent


@pytest.mark.parametrize("extra", [{}, {"num_draft_tokens": 3}, {"draft_source": "draft_model"}])
def test_a_field_added_for_the_lane_is_never_sent_twice(extra: dict[str, object]) -> None:
    data = {"model": "m", "messages": [{"role": "user", "content": "é \u2028 x"}], **extra}
    parsed = parse_request("chat", orjson.dumps(data))
    for body, key, value in ((parsed.body(plain=True), "num_draft_tokens", 0),
                             (parsed.body(draft_source="prompt_lookup"), "draft_source",
                              extra.get("draft_source", "prompt_lookup"))):
        assert body.count(f'"{key}"'.encode()) == 1
        assert orjson.loads(body) == {**data, key: value}
    parsed.set_field("max_tokens", 5)  # a change after parsing reaches the variants too
    assert orjson.loads(parsed.body(plain=True))["max_tokens"] == 5
