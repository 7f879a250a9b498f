"""router.kernel.sse: framing, event splitting and the [DONE] rule, as the relay, the front doors,
the worker and the benchmarks read and write streams."""

from __future__ import annotations

import asyncio
import itertools
import random
from collections.abc import AsyncIterator

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from router.kernel import sse
from router.kernel.sse import (
    DONE_LINE,
    HELD_LIMIT,
    SSETail,
    first_event_is_json,
    has_done_line,
    looks_like_sse,
    split_events,
)
from tests.fuzzing import examples

E = b'data: {"a": 1}\n\n'


# --- writing --------------------------------------------------------------------------------


def test_frames_read_back_as_written() -> None:
    written = sse.frame(b'{"a": 1}') + sse.event_json("ping", {"b": 2}) + sse.DONE_EVENT
    assert written == b'data: {"a": 1}\n\nevent: ping\ndata: {"b":2}\n\ndata: [DONE]\n\n'
    assert list(sse.payloads(written)) == [b'{"a": 1}', b'{"b":2}', b"[DONE]"]
    assert sse.through_done(written) == (written, b"") and has_done_line(written)


# --- events and their data ------------------------------------------------------------------


@pytest.mark.parametrize(
    ("data", "expected"),
    [
        (E, [b'{"a": 1}']),
        (E.replace(b"\n", b"\r\n"), [b'{"a": 1}']),  # CRLF
        (b"data: line one\ndata: line two\n\n", [b"line one\nline two"]),  # multi-line data
        (b"data: a\r\ndata: b\r\n\r\n", [b"a\nb"]),
        (b": keep-alive\n\n" + E, [b'{"a": 1}']),  # comments are skipped
        (b": note\ndata: x\n\n", [b"x"]),  # a comment inside an event
        (b"event: message\nid: 7\ndata: x\n\n", [b"x"]),
        (b"event: empty\n\n", []),  # an event without data
        (b"data:x\n\n", [b"x"]),  # the space after the colon is optional
        (b"data: [DONE]\n\n", [b"[DONE]"]),
        (b'data: {"a": 1}', [b'{"a": 1}']),  # an unterminated last event counts
        (b"", []),
    ],
)
def test_payloads(data: bytes, expected: list[bytes]) -> None:
    assert list(sse.payloads(data)) == expected


def test_json_events_skip_done_malformed_and_non_objects() -> None:
    data = E + b"data: {oops}\n\ndata: [1, 2]\n\n: ping\n\n" + E + sse.DONE_EVENT
    assert list(sse.json_events(data)) == [{"a": 1}, {"a": 1}]


@pytest.mark.parametrize(
    ("payload", "done"),
    [(b"[DONE]", True), (b" [DONE] ", True), (b"[DONE]x", False), (b'"[DONE]"', False)],
)
def test_is_done(payload: bytes, done: bool) -> None:
    assert sse.is_done(payload) is done


def test_first_chunk_framing() -> None:
    assert looks_like_sse(b"data: {}\n\n")
    assert looks_like_sse(b": keep-alive\n\n")
    assert looks_like_sse(b"\nevent: x\n")
    assert looks_like_sse(b"")
    assert not looks_like_sse(b"<html>")
    assert not looks_like_sse(b'{"choices": []}')


# --- splitting a relayed stream into whole events -------------------------------------------


@pytest.mark.parametrize(
    ("data", "whole", "held"),
    [
        (E, E, b""),
        (E * 3, E * 3, b""),
        (E + E[:7], E, E[:7]),
        (E[:7], b"", E[:7]),
        (b"", b"", b""),
        (E.replace(b"\n", b"\r\n") + b"data: {", E.replace(b"\n", b"\r\n"), b"data: {"),
        (b": ping\n\n" + b"data: x", b": ping\n\n", b"data: x"),
        (b"data: a\ndata: b\n\ndata: c\n", b"data: a\ndata: b\n\n", b"data: c\n"),
        (b"data: [DONE]\n", b"", b"data: [DONE]\n"),  # passed on at the end of the stream
    ],
)
def test_split_events_keeps_back_only_an_incomplete_last_event(
    data: bytes, whole: bytes, held: bytes
) -> None:
    assert split_events(data) == (whole, held)
    assert whole + held == data


def test_split_events_never_holds_more_than_the_limit() -> None:
    data = b"data: " + b"x" * (HELD_LIMIT + 1)
    assert split_events(data) == (data, b"")


def test_split_events_fast_path_returns_the_same_object() -> None:
    chunk = E * 2
    assert split_events(chunk)[0] is chunk  # no copy for the usual chunk


@settings(max_examples=examples(200), deadline=None)
@given(cuts=st.lists(st.integers(0, 200), max_size=8))
def test_partial_chunks_rejoin_into_the_same_events(cuts: list[int]) -> None:
    """However the stream is cut into chunks, the whole events written are the stream."""
    stream = (E + b": ping\r\n\r\n" + b"data: a\ndata: b\n\n") * 3 + sse.DONE_EVENT
    bounds = sorted({min(c, len(stream)) for c in cuts} | {0, len(stream)})
    written, held = b"", b""
    for start, end in itertools.pairwise(bounds):
        whole, held = split_events(held + stream[start:end])
        written += whole
    assert written + held == stream and held == b""
    assert list(sse.payloads(written)) == list(sse.payloads(stream))


@pytest.mark.parametrize(
    ("chunk", "ok"),
    [
        (E, True),
        (b"data: [DONE]\n\n", True),
        (b": keep-alive\n\n" + E, True),
        (b'data: {"a": 1', True),  # not complete yet: judged by the client, not here
        (b"data: {oops}\n\n", False),
        (b"data: hello\n\n" + E, False),
        (b"event: message\ndata: [1, 2]\n\n", True),
        (E + b"data: {oops}\n\n", True),  # only the first event is judged
        (b": ping\r\n\r\ndata: {oops}\r\n\r\n", False),
        (b'data: {"a":\ndata: 1}\n\n', True),  # multi-line data joined before it is parsed
    ],
)
def test_first_event_is_json(chunk: bytes, ok: bool) -> None:
    assert first_event_is_json(chunk) is ok


# --- the [DONE] rule --------------------------------------------------------------------------

DONE_CASES = [
    b"data: [DONE]\n\n",
    b"data:[DONE]\n\n",
    b"data: [DONE]",
    b"data: [DONE] \r\n\r\n",
    b'data: {"x": "[DONE]"}\n\n',
    b'data: {"x": "[DONE]"}\n\ndata: [DONE]\n\n',
    b'data: {"x": "\\ndata: [DONE]"}\n\n',
    b"xdata: [DONE]\n\n",
    b"data: [DONE]x\n\n",
    b": [DONE]\ndata: [DONE]\n\n",
    b"[DONE]",
    b"data: [DONE]\t\n",
    b"\ndata: [DONE]",
    b"",
    b"data: [DON",
    b'data: {"a": 1}\n\n' * 10 + b"data: [DONE]\n\n",
]


@pytest.mark.parametrize("events", DONE_CASES)
def test_done_line_search_agrees_with_the_whole_pattern(events: bytes) -> None:
    """The search started just before the first [DONE] answers as the pattern does over
    all the bytes (it is an optimisation only)."""
    assert has_done_line(events) == (DONE_LINE.search(events) is not None)


def test_done_line_search_agrees_on_random_mixtures() -> None:
    rng = random.Random(7)
    pieces = [b"data:", b" ", b"[DONE]", b"\n", b"\r\n", b"\t", b"x", b'{"c": "[DONE]"}', b":"]
    agreed = {True: 0, False: 0}
    for _ in range(5000):
        events = b"".join(rng.choice(pieces) for _ in range(rng.randrange(1, 12)))
        expected = DONE_LINE.search(events) is not None
        assert has_done_line(events) == expected, events
        agreed[expected] += 1
    assert agreed[True] > 20 and agreed[False] > 20  # both answers were exercised


@pytest.mark.parametrize(
    ("events", "ends"),
    [
        (E + sse.DONE_EVENT, True),
        (E + b"data:[DONE]\r\n\r\n", True),
        (sse.DONE_EVENT + E, False),
        (b'data: {"x": "data: [DONE]"}\n\n', False),
    ],
)
def test_ends_with_done(events: bytes, ends: bool) -> None:
    assert (sse.through_done(events)[0] == events and has_done_line(events)) is ends


# --- a client reading line by line ------------------------------------------------------------


async def _lines(*lines: bytes) -> AsyncIterator[bytes]:
    for line in lines:
        await asyncio.sleep(0)
        yield line


async def _read(*lines: bytes) -> list[bytes]:
    return [p async for p in sse.read_payloads(_lines(*lines))]


async def test_read_payloads_joins_multi_line_data_and_skips_comments() -> None:
    assert await _read(
        b": hello\n",
        b"\n",
        b"data: a\n",
        b"data: b\n",
        b"\n",
        b"event: x\r\n",
        b"data: c\r\n",
        b"\r\n",
    ) == [b"a\nb", b"c"]


async def test_read_payloads_passes_an_unterminated_last_event() -> None:
    assert await _read(b'data: {"a": 1}\n', b"\n", b"data: [DONE]") == [b'{"a": 1}', b"[DONE]"]


async def test_read_payloads_over_a_real_stream() -> None:
    """What the benchmarks read from an aiohttp response, served by a loopback server."""
    from aiohttp import ClientSession, web
    from aiohttp.test_utils import TestServer

    body = sse.frame(b'{"a": 1}') + b": ping\r\n\r\n" + b"data: x\ndata: y\n\n" + sse.DONE_EVENT

    async def stream(request: web.Request) -> web.StreamResponse:
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        for i in range(0, len(body), 5):  # partial chunks
            await resp.write(body[i : i + 5])
        return resp

    app = web.Application()
    app.router.add_get("/", stream)
    async with (
        TestServer(app) as server,
        ClientSession() as session,
        session.get(server.make_url("/")) as resp,
    ):
        got = [p async for p in sse.read_payloads(resp.content)]
    assert got == [b'{"a": 1}', b"x\ny", b"[DONE]"]


# --- the tail of a relayed stream -----------------------------------------------------------


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
    for piece in (b'data: {"a"', b": 1}\r\n\r\nda", b"ta: [DONE]\r\n\r\n"):
        tail.feed(piece)
    assert tail.last_events() == ([{"a": 1}], 0)
    assert tail.saw_done()


def test_sse_tail_counts_malformed_events() -> None:
    tail = SSETail()
    tail.feed(b"data: {broken\n\ndata: 5\n\n")
    assert tail.last_events() == ([], 2)
    assert not tail.saw_done()


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


def test_sse_tail_joins_multi_line_data() -> None:
    tail = SSETail()
    tail.feed(b'data: {"a":\ndata: 1}\n\n: ping\n\n' + sse.DONE_EVENT)
    assert tail.finish() == ([{"a": 1}], 0, True)


def tail_payloads_by_split(buf: bytes, want: int) -> list[bytes]:
    """The straightforward reading the windowed tail must agree with: every event
    of the whole buffer, then the last ``want`` that have data."""
    return list(sse.payloads(buf))[-want:]


sse_pieces = st.sampled_from(
    [
        b"data: ",
        b"data:",
        b'{"a":1}',
        b"[DONE]",
        b"\n",
        b"\r\n",
        b"\n\n",
        b": keep-alive",
        b"event: x",
        b"x" * 300,
        b" ",
    ]
)


@settings(max_examples=examples(400), deadline=None)
@given(pieces=st.lists(sse_pieces, max_size=60), want=st.integers(1, 8))
def test_the_tail_window_reads_the_same_payloads_as_splitting_everything(
    pieces: list[bytes], want: int
) -> None:
    buf = b"".join(pieces)
    assert sse.tail_payloads(bytearray(buf), want) == tail_payloads_by_split(buf, want)


@pytest.mark.parametrize(
    ("events", "through", "after"),
    [
        (b"data: 1\n\ndata: [DONE]\n\n", b"data: 1\n\ndata: [DONE]\n\n", b""),
        (b"data: [DONE]\n\ndata: {}\n\n", b"data: [DONE]\n\n", b"data: {}\n\n"),
        (b"data: [DONE]\r\n\r\nx", b"data: [DONE]\r\n\r\n", b"x"),
        (b"data:[DONE]\nid: 3\n\ndata: 2\n\n", b"data:[DONE]\nid: 3\n\n", b"data: 2\n\n"),
        (b'data: {"t": "[DONE]"}\n\n', b'data: {"t": "[DONE]"}\n\n', b""),  # content, not end
        (b"data: [DONE]", b"data: [DONE]", b""),  # not whole yet
    ],
)
def test_through_done_cuts_after_the_end_event(events: bytes, through: bytes, after: bytes) -> None:
    assert sse.through_done(events) == (through, after)


@pytest.mark.parametrize(
    ("rest", "benign"),
    [
        (b"", True),
        (b"\r\n\n", True),
        (b": keep-alive\n\ndata: [DONE]\n\n", True),
        (b"data: {}\n\n", False),
        (b"garbage", False),
        (b"event: error\ndata: [DONE]\n\n", False),
    ],
)
def test_only_done_after(rest: bytes, benign: bool) -> None:
    assert sse.only_done_after(rest) is benign


@pytest.mark.parametrize(
    ("events", "tail"),
    [
        (b"data: 1\n\ndata: [DONE]\n\n", b""),
        (sse.DONE_EVENT, b""),
        (b"data: [DONE]\n\ndata: {}\n\n", b"data: {}\n\n"),
        (b"data: [DONE]\r\n\r\n", b""),
        (b"data: [DONE]\n\ndata: [DONE]\n\n", b"data: [DONE]\n\n"),
        (b'data: {"t": "x data: [DONE]\n\n"}', None),  # inside content, not at a line start
        (b'data: {"t": "[DONE]"}\n\n', None),
        (b"data: 1\n\n", None),
    ],
)
def test_done_tail(events: bytes, tail: bytes | None) -> None:
    assert sse.done_tail(events) == tail
    if tail is not None:
        assert sse.through_done(events)[1] == tail
