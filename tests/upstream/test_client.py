"""router.upstream.client: the relay's HTTP/1.1 client, its parser alone and against real
servers."""

from __future__ import annotations

import asyncio
import random
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager

import pytest
from aiohttp import web
from hypothesis import given, settings
from hypothesis import strategies as st

from router.upstream.client import (
    Http1Pool,
    ProtocolViolation,
    ResponseParser,
    UpstreamConnectionError,
    split_url,
)
from tests.conftest import serve_app, wait_until
from tests.fuzzing import examples

CHUNKED = (
    b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n"
    b"Transfer-Encoding: chunked\r\nX-Twice: a\r\nX-Twice: b\r\n\r\n"
    b"6;ext=1\r\ndata: \r\n5\r\nhello\r\n0\r\nX-Trailer: t\r\n\r\n"
)


def _feed_in_pieces(raw: bytes, size: int) -> tuple[ResponseParser, bytes]:
    parser = ResponseParser()
    body = b"".join(b"".join(parser.feed(raw[i : i + size])) for i in range(0, len(raw), size))
    return parser, body


@pytest.mark.parametrize("size", [1, 2, 3, 7, 1000])
def test_chunked_body_is_the_same_however_the_bytes_are_split(size: int) -> None:
    parser, body = _feed_in_pieces(CHUNKED, size)
    assert body == b"data: hello"
    assert parser.done and parser.keep_alive
    assert parser.status == 200
    assert parser.headers.get("content-type") == "text/event-stream"
    assert parser.headers.get("X-TWICE") == "a, b"


def test_many_small_chunks_in_reads_of_any_size() -> None:
    """The tight loop for whole chunks and the general path agree wherever reads split."""
    events = [b'data: {"t": %d}\n\n' % i for i in range(300)]
    raw = (
        b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"
        + b"".join(b"%x\r\n%s\r\n" % (len(e), e) for e in events)
        + b"0\r\n\r\n"
    )
    rng = random.Random(7)
    for _ in range(50):
        parser = ResponseParser()
        pos, body = 0, []
        while pos < len(raw):
            step = rng.choice((1, 5, 17, 300, 4096, 100_000))
            body += parser.feed(raw[pos : pos + step])
            pos += step
        assert b"".join(body) == b"".join(events) and parser.done


# Chunk data drawn from bytes that make framing hard: CR, LF, hex digits, ';'.
_HARD = b"\r\n0a;F x"
_DATA = st.binary(min_size=1, max_size=24).map(lambda b: bytes(_HARD[v % len(_HARD)] for v in b))


def _chunked(chunks: list[bytes], upper: bool, ext: bool) -> bytes:
    size = b"%X" if upper else b"%x"
    return (
        b"".join(size % len(c) + (b";e=1" if ext else b"") + b"\r\n" + c + b"\r\n" for c in chunks)
        + b"0\r\n\r\n"
    )


@settings(max_examples=examples(300), deadline=None)
@given(
    chunks=st.lists(_DATA, min_size=1, max_size=30),
    upper=st.booleans(),
    ext=st.booleans(),
    cuts=st.lists(st.integers(min_value=1, max_value=200), max_size=12),
)
def test_chunked_decoding_matches_the_chunks_for_any_data_and_reads(
    chunks: list[bytes], upper: bool, ext: bool, cuts: list[int]
) -> None:
    """Whatever the data holds (CRLF, digits) and wherever reads end, the body is the
    chunks' data: the split-at-CRLF shortcut never accepts a framing it misreads."""
    raw = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n" + _chunked(chunks, upper, ext)
    parser, body, pos = ResponseParser(), [], 0
    for step in [*cuts, len(raw)]:
        body += parser.feed(raw[pos : pos + step])
        pos += step
    assert b"".join(body) == b"".join(chunks) and parser.done


def test_content_length_body_and_what_follows_it() -> None:
    parser, body = _feed_in_pieces(b"HTTP/1.1 200 OK\r\nContent-Length: 3\r\n\r\nabcEXTRA", 4)
    assert body == b"abc" and parser.done
    assert not parser.keep_alive  # bytes after the answer: the connection is not reused


def test_empty_bodies() -> None:
    for raw in (
        b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n",
        b"HTTP/1.1 204 No Content\r\n\r\n",
    ):
        parser, body = _feed_in_pieces(raw, 5)
        assert body == b"" and parser.done


def test_body_until_close_ends_at_eof() -> None:
    parser = ResponseParser()
    assert parser.feed(b"HTTP/1.0 200 OK\r\n\r\nsome") == [b"some"]
    assert not parser.done and not parser.keep_alive
    parser.feed_eof()
    assert parser.done


def test_eof_before_the_end_is_a_violation() -> None:
    parser = ResponseParser()
    parser.feed(b"HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\nabc")
    with pytest.raises(ProtocolViolation):
        parser.feed_eof()


def test_interim_answers_are_skipped() -> None:
    parser, body = _feed_in_pieces(
        b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 201 Created\r\nContent-Length: 2\r\n\r\nok", 3
    )
    assert (parser.status, body) == (201, b"ok")


def test_connection_close_is_honoured() -> None:
    raw = b"HTTP/1.1 200 OK\r\nConnection: close\r\nContent-Length: 0\r\n\r\n"
    parser, _ = _feed_in_pieces(raw, 100)
    assert parser.done and not parser.keep_alive


@pytest.mark.parametrize("size", [b"0x5", b"+5", b"-5", b"5_0", b" 5", b"", b"5 5", b"g"])
def test_chunk_sizes_are_hex_digits_only(size: bytes) -> None:
    """Forms ``int(x, 16)`` would take but no server sends are framing errors, however the
    read is cut (whole, or the size line on its own)."""
    head = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"
    body = b"5\r\nhello\r\n" + size + b"\r\nworld\r\n0\r\n\r\n"
    for cut in (len(body), 10, 11):
        parser = ResponseParser()
        with pytest.raises(ProtocolViolation):
            parser.feed(head + body[:cut])
            parser.feed(body[cut:])


@pytest.mark.parametrize("size", [b"5", b"0" * 20 + b"5", b"5 ", b"5;x=1", b"5 ;x=1"])
def test_chunk_sizes_may_have_leading_zeros_whitespace_and_extensions(size: bytes) -> None:
    head = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"
    parser, body = _feed_in_pieces(
        head + b"5\r\nhello\r\n" + size + b"\r\nworld\r\n0\r\n\r\n", 1000
    )
    assert body == b"helloworld" and parser.done


@pytest.mark.parametrize(
    "raw",
    [
        b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n",
        b"SPDY 200 OK\r\n\r\n",
        b"HTTP/1.1 abc OK\r\n\r\n",
        b"HTTP/1.1 200 OK\r\nno colon here\r\n\r\n",
        b"HTTP/1.1 200 OK\r\nContent-Length: -1\r\n\r\n",
        b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabcXY",
        b"HTTP/1.1 200 OK\r\nTransfer-Encoding: gzip\r\n\r\n",
    ],
)
def test_broken_answers_are_violations(raw: bytes) -> None:
    with pytest.raises(ProtocolViolation):
        ResponseParser().feed(raw)


def test_split_url() -> None:
    origin, target = split_url("http://127.0.0.1:8000/v1/chat/completions?x=1")
    assert (origin.host, origin.port, target) == ("127.0.0.1", 8000, "/v1/chat/completions?x=1")
    assert split_url("https://example.com/v1")[0].host_header == "example.com"
    with pytest.raises(ValueError):
        split_url("ftp://example.com/")


# --- against real servers ---------------------------------------------------------------

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


@asynccontextmanager
async def aiohttp_server(handler: Handler) -> AsyncIterator[str]:
    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", handler)
    # Cancelled handlers are how a server sees its client go (as speclane's own app does).
    async with serve_app(app, handler_cancellation=True) as port:
        yield f"http://127.0.0.1:{port}"


@asynccontextmanager
async def raw_server(
    serve: Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]],
) -> AsyncIterator[str]:
    server = await asyncio.start_server(serve, "127.0.0.1", 0)
    try:
        yield f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}"
    finally:
        server.close()


async def _read_request(reader: asyncio.StreamReader) -> bytes:
    head = await reader.readuntil(b"\r\n\r\n")
    length = next(
        (
            int(line.split(b":")[1])
            for line in head.split(b"\r\n")
            if line.lower().startswith(b"content-length:")
        ),
        0,
    )
    return head + await reader.readexactly(length)


@pytest.fixture
async def pool() -> AsyncIterator[Http1Pool]:
    p = Http1Pool()
    yield p
    await p.close()


async def test_request_sends_the_body_and_headers_and_reuses_the_connection(
    pool: Http1Pool,
) -> None:
    peers: list[object] = []

    async def echo(request: web.Request) -> web.Response:
        peers.append(request.transport.get_extra_info("peername") if request.transport else None)
        body = await request.read()
        return web.Response(
            body=body,
            headers={"X-Auth": request.headers.get("Authorization", ""), "X-Host": request.host},
        )

    async with aiohttp_server(echo) as base:
        for i in range(3):
            resp = await pool.request(
                "POST",
                f"{base}/v1/x",
                body=b"payload%d" % i,
                headers={"Authorization": "Bearer k"},
                read_timeout=5,
            )
            assert resp.status == 200
            assert await resp.read() == b"payload%d" % i
            assert resp.headers["x-auth"] == "Bearer k"
            assert resp.headers["X-Host"] == base.split("//")[1]
            resp.close()
    assert len(peers) == 3 and len(set(peers)) == 1  # one kept-alive connection


async def test_streamed_body_arrives_in_order_and_pauses_a_slow_reader(pool: Http1Pool) -> None:
    piece = b"x" * 65536

    async def big(request: web.Request) -> web.StreamResponse:
        resp = web.StreamResponse()
        await resp.prepare(request)
        for i in range(64):  # 4 MiB, more than the pause threshold
            await resp.write(bytes([65 + i % 26]) + piece[1:])
        await resp.write_eof()
        return resp

    async with aiohttp_server(big) as base:
        resp = await pool.request("POST", f"{base}/", read_timeout=5)
        await wait_until(lambda: resp._paused)  # nobody read: the socket is paused
        assert resp._conn is not None and resp._conn.transport is not None
        assert not resp._conn.transport.is_reading()
        body = await resp.read()
    assert len(body) == 64 * 65536
    assert [body[i * 65536] for i in range(64)] == [65 + i % 26 for i in range(64)]


async def test_silence_is_a_timeout_and_closing_tells_the_server(pool: Http1Pool) -> None:
    gone = asyncio.Event()

    async def stall(request: web.Request) -> web.StreamResponse:
        resp = web.StreamResponse()
        await resp.prepare(request)
        await resp.write(b"first")
        try:
            await asyncio.sleep(30)
        except asyncio.CancelledError:
            gone.set()
            raise
        return resp

    async with aiohttp_server(stall) as base:
        resp = await pool.request("POST", f"{base}/", read_timeout=0.3)
        assert await resp.readany() == b"first"
        with pytest.raises(TimeoutError):
            await resp.readany()
        resp.close()
        await asyncio.wait_for(gone.wait(), 5)  # the upstream handler saw the disconnect


async def test_the_timeout_is_per_wait_not_per_answer(pool: Http1Pool) -> None:
    """A stream that keeps talking outlives its read timeout many times over, and time the
    reader spends away between reads does not count: only a wait that lasts the timeout
    fails (one timer serves the whole answer, moved on as waits begin)."""

    async def trickle(request: web.Request) -> web.StreamResponse:
        resp = web.StreamResponse()
        await resp.prepare(request)
        for i in range(25):  # 2.5 s in all, 0.1 s apart: a tenth of the timeout
            await resp.write(b"%d," % i)
            await asyncio.sleep(0.1)
        await resp.write_eof()
        return resp

    async with aiohttp_server(trickle) as base:
        resp = await pool.request("POST", f"{base}/", read_timeout=1.0)
        body = await resp.readany()
        await asyncio.sleep(1.2)  # away longer than the timeout, while bytes keep coming
        body += await resp.read()
        assert body == b"".join(b"%d," % i for i in range(25))
        assert resp._timer is None  # nothing outlives the answer
        resp.close()


async def test_close_wakes_a_pending_reader(pool: Http1Pool) -> None:
    async def stall(request: web.Request) -> web.StreamResponse:
        resp = web.StreamResponse()
        await resp.prepare(request)
        await resp.write(b"x")
        await asyncio.sleep(30)
        return resp

    async with aiohttp_server(stall) as base:
        resp = await pool.request("POST", f"{base}/", read_timeout=30)
        await resp.readany()
        reading = asyncio.create_task(resp.readany())
        await asyncio.sleep(0)
        resp.close()
        with pytest.raises(UpstreamConnectionError):
            await asyncio.wait_for(reading, 5)


async def test_refused_and_unanswered_connections(pool: Http1Pool) -> None:
    async with raw_server(lambda r, w: asyncio.sleep(0)) as base:
        pass  # closed: nothing listens there any more
    with pytest.raises(UpstreamConnectionError):
        await pool.request("POST", f"{base}/", connect_timeout=2)

    async def hang_up(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await _read_request(reader)
        writer.close()

    async with raw_server(hang_up) as base:
        with pytest.raises(UpstreamConnectionError):
            await pool.request("POST", f"{base}/", read_timeout=5)


async def test_cut_body_is_an_error_not_an_end(pool: Http1Pool) -> None:
    async def cut(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await _read_request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n")
        await writer.drain()
        writer.close()

    async with raw_server(cut) as base:
        resp = await pool.request("POST", f"{base}/", read_timeout=5)
        assert await resp.readany() == b"abc"
        with pytest.raises(UpstreamConnectionError):
            await resp.readany()


async def test_a_stale_kept_alive_connection_is_replaced_once(pool: Http1Pool) -> None:
    """The server closes an idle connection just as it is reused: the request never ran,
    so it goes again on a fresh connection."""
    connections = 0

    async def answer_once_then_drop(
        reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> None:
        nonlocal connections
        connections += 1
        await _read_request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
        await writer.drain()
        try:
            await _read_request(reader)  # the second request on this connection: dropped
        except asyncio.IncompleteReadError:
            pass
        writer.close()

    async with raw_server(answer_once_then_drop) as base:
        await _two_ok_answers(pool, base)
    assert connections == 2


async def test_bytes_after_the_answer_are_not_reused(pool: Http1Pool) -> None:
    connections = 0

    async def extra(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        nonlocal connections
        connections += 1
        while True:
            try:
                await _read_request(reader)
            except asyncio.IncompleteReadError:
                return
            writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nokJUNK")
            await writer.drain()

    async with raw_server(extra) as base:
        await _two_ok_answers(pool, base)
    assert connections == 2


async def _two_ok_answers(pool: Http1Pool, base: str) -> None:
    for _ in range(2):
        resp = await pool.request("POST", f"{base}/", read_timeout=5)
        assert await resp.read() == b"ok"
        resp.close()


async def test_an_http10_stream_read_until_close(pool: Http1Pool) -> None:
    """mlx_lm.server (Python's http.server) answers in HTTP/1.0 and ends a stream by closing."""

    async def http10(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await _read_request(reader)
        writer.write(b"HTTP/1.0 200 OK\r\nContent-Type: text/event-stream\r\n\r\n")
        for i in range(3):
            writer.write(b'data: {"i": %d}\n\n' % i)
            await writer.drain()
        writer.close()

    async with raw_server(http10) as base:
        resp = await pool.request("POST", f"{base}/", read_timeout=5)
        assert resp.headers.get("content-type") == "text/event-stream"
        assert await resp.read() == b"".join(b'data: {"i": %d}\n\n' % i for i in range(3))
        assert resp.complete


@pytest.mark.parametrize("stream", [False, True])
async def test_a_compressed_answer_is_decoded(pool: Http1Pool, stream: bool) -> None:
    """speclane asks for identity; a server that gzips anyway is still understood."""
    payload = b'data: {"i": 1}\n\n' * 200

    async def gzipped(request: web.Request) -> web.StreamResponse:
        resp: web.StreamResponse = web.StreamResponse() if stream else web.Response(body=payload)
        resp.enable_compression(web.ContentCoding.gzip)
        if stream:
            await resp.prepare(request)
            for i in range(0, len(payload), 1000):
                await resp.write(payload[i : i + 1000])
            await resp.write_eof()
        return resp

    async with aiohttp_server(gzipped) as base:
        resp = await pool.request("POST", f"{base}/", read_timeout=5)
        assert resp.headers.get("content-encoding") == "gzip"
        assert await resp.read() == payload


async def test_an_unknown_encoding_is_an_error(pool: Http1Pool) -> None:
    async def brotli(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await _read_request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Encoding: br\r\nContent-Length: 3\r\n\r\nabc")
        await writer.drain()

    async with raw_server(brotli) as base:
        with pytest.raises(UpstreamConnectionError, match="content-encoding"):
            resp = await pool.request("POST", f"{base}/", read_timeout=5)
            await resp.read()
