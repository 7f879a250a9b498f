"""The relay's SSE framing helpers (router.proxy.request): whole events, first event checked."""

from __future__ import annotations

import pytest

from router.proxy.request import HELD_LIMIT, first_event_is_json, split_events

E = b'data: {"a": 1}\n\n'


@pytest.mark.parametrize(("data", "whole", "held"), [
    (E, E, b""),
    (E * 3, E * 3, b""),
    (E + E[:7], E, E[:7]),
    (E[:7], b"", E[:7]),
    (b"", b"", b""),
    (E.replace(b"\n", b"\r\n") + b"data: {", E.replace(b"\n", b"\r\n"), b"data: {"),
    (b": ping\n\n" + b"data: x", b": ping\n\n", b"data: x"),
    (b"data: [DONE]\n", b"", b"data: [DONE]\n"),  # passed on at the end of the stream
])
def test_split_events_keeps_back_only_an_incomplete_last_event(data: bytes, whole: bytes,
                                                               held: bytes) -> None:
    assert split_events(data) == (whole, held)
    assert whole + held == data


def test_split_events_never_holds_more_than_the_limit() -> None:
    data = b"data: " + b"x" * (HELD_LIMIT + 1)
    assert split_events(data) == (data, b"")


def test_split_events_fast_path_returns_the_same_object() -> None:
    chunk = E * 2
    assert split_events(chunk)[0] is chunk  # no copy for the usual chunk


@pytest.mark.parametrize(("chunk", "ok"), [
    (E, True),
    (b"data: [DONE]\n\n", True),
    (b": keep-alive\n\n" + E, True),
    (b'data: {"a": 1', True),  # not complete yet: judged by the client, not here
    (b"data: {oops}\n\n", False),
    (b"data: hello\n\n" + E, False),
    (b"event: message\ndata: [1, 2]\n\n", True),
    (E + b"data: {oops}\n\n", True),  # only the first event is judged
    (b": ping\r\n\r\ndata: {oops}\r\n\r\n", False),
])
def test_first_event_is_json(chunk: bytes, ok: bool) -> None:
    assert first_event_is_json(chunk) is ok
