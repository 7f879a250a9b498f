"""Backends that fail: every fault is injected for real and judged by what the client sees.

Complements tests/proxy/test_relay.py (which covers a fake dying or stalling mid-stream, a missing
[DONE], and garbage bodies): here the faults sit below HTTP (a socket that never answers,
headers then silence, a body or an event cut in half), a backend process is SIGKILLed with
streams in flight, and each fault is also checked for its time bound, that the upstream
connection was closed (the work upstream stops), that the in-flight counters return to zero,
and that the official openai client raises a typed error rather than hanging or choking.
"""

from __future__ import annotations

import asyncio
import signal
import socket
import sys
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

import aiohttp
import openai
import orjson
import pytest

from router.bench.common.procs import spawn_until_line, stop
from tests.conftest import fake_upstreams, router_settings, run_router, wait_until
from tests.reliability.harness import (
    TALLY,
    RawUpstream,
    StreamResult,
    assert_openai_error,
    chat_body,
    metric_total,
    post_stream,
    read_stream,
    sse_payloads,
)

READ_TIMEOUT = 0.5
SLACK = 3.0  # scheduling slack on a loaded 2-core machine
SSE_HEAD = (
    b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n"
)


def chunk(data: bytes) -> bytes:
    return b"%x\r\n%s\r\n" % (len(data), data)


def event(payload: dict) -> bytes:
    return b"data: " + orjson.dumps(payload) + b"\n\n"


CONTENT = event(
    {
        "id": "c1",
        "object": "chat.completion.chunk",
        "created": 0,
        "model": "m",
        "choices": [{"index": 0, "delta": {"content": "hello "}, "finish_reason": None}],
    }
)
FINISH = event(
    {
        "id": "c1",
        "object": "chat.completion.chunk",
        "created": 0,
        "model": "m",
        "choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}],
    }
)


# --- the fault scripts (what the upstream does after reading a request) ---------------------


async def never_answers(up: RawUpstream, reader, writer, body) -> None:  # type: ignore[no-untyped-def]
    await up.wait_peer_close(reader)


async def sse_headers_then_silence(up: RawUpstream, reader, writer, body) -> None:  # type: ignore[no-untyped-def]
    writer.write(SSE_HEAD)
    await writer.drain()
    await up.wait_peer_close(reader)


async def json_headers_then_silence(up: RawUpstream, reader, writer, body) -> None:  # type: ignore[no-untyped-def]
    writer.write(
        b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
        b'Content-Length: 300\r\n\r\n{"id": "x", '
    )
    await writer.drain()
    await up.wait_peer_close(reader)


async def body_cut_short(up: RawUpstream, reader, writer, body) -> None:  # type: ignore[no-untyped-def]
    writer.write(
        b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
        b'Content-Length: 300\r\n\r\n{"id": "x", "choices": ['
    )
    await writer.drain()  # then the connection closes: fewer bytes than announced


async def event_cut_mid_way(up: RawUpstream, reader, writer, body) -> None:  # type: ignore[no-untyped-def]
    # A process dying inside a write leaves half an event on the wire.
    writer.write(SSE_HEAD + chunk(CONTENT) + chunk(CONTENT[:40]))
    await writer.drain()
    writer.transport.abort()


async def event_cut_then_silence(up: RawUpstream, reader, writer, body) -> None:  # type: ignore[no-untyped-def]
    writer.write(SSE_HEAD + chunk(CONTENT) + chunk(CONTENT[:40]))
    await writer.drain()
    await up.wait_peer_close(reader)


async def sse_answer_to_json_request(up: RawUpstream, reader, writer, body) -> None:  # type: ignore[no-untyped-def]
    # A backend that ignores "stream": false.
    payload = CONTENT + FINISH + b"data: [DONE]\n\n"
    writer.write(
        b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n"
        b"Content-Length: %d\r\n\r\n%s" % (len(payload), payload)
    )
    await writer.drain()


async def malformed_first_event(up: RawUpstream, reader, writer, body) -> None:  # type: ignore[no-untyped-def]
    writer.write(
        SSE_HEAD
        + chunk(b'data: {"id": "c1", oops}\n\n')
        + chunk(FINISH)
        + chunk(b"data: [DONE]\n\n")
        + b"0\r\n\r\n"
    )
    await writer.drain()


async def crlf_framed_stream(up: RawUpstream, reader, writer, body) -> None:  # type: ignore[no-untyped-def]
    # Valid SSE with CRLF line ends, events split across TCP writes: must pass untouched.
    data = (CONTENT + FINISH + b"data: [DONE]\n\n").replace(b"\n", b"\r\n")
    writer.write(SSE_HEAD)
    for i in range(0, len(data), 17):
        writer.write(chunk(data[i : i + 17]))
        await writer.drain()
    writer.write(b"0\r\n\r\n")
    await writer.drain()


@dataclass(frozen=True)
class Fault:
    name: str
    script: Callable[..., Awaitable[None]]
    stream: bool
    status: int  # what the client gets: 200 (an error event, or success) or an error status
    code: str | None  # the error code; None: the answer is a success
    stalls: bool = False  # the upstream holds the connection open: the router must close it


FAULTS = [
    Fault("never_answers", never_answers, False, 504, "upstream_timeout", stalls=True),
    Fault("never_answers", never_answers, True, 504, "upstream_timeout", stalls=True),
    Fault(
        "sse_headers_then_silence",
        sse_headers_then_silence,
        True,
        504,
        "upstream_timeout",
        stalls=True,
    ),
    Fault(
        "json_headers_then_silence",
        json_headers_then_silence,
        False,
        504,
        "upstream_timeout",
        stalls=True,
    ),
    Fault("body_cut_short", body_cut_short, False, 502, "upstream_error"),
    Fault("event_cut_mid_way", event_cut_mid_way, True, 200, "upstream_error"),
    Fault(
        "event_cut_then_silence", event_cut_then_silence, True, 200, "upstream_timeout", stalls=True
    ),
    Fault(
        "sse_answer_to_json_request", sse_answer_to_json_request, False, 502, "upstream_bad_json"
    ),
    Fault("malformed_first_event", malformed_first_event, True, 502, "upstream_bad_stream"),
    Fault("crlf_framed_stream", crlf_framed_stream, True, 200, None),
]


def fault_id(f: Fault) -> str:
    return f"{f.name}-{'stream' if f.stream else 'json'}"


def check_answer(fault: Fault, res: StreamResult) -> None:
    assert res.terminated, "the answer was cut instead of ending cleanly"
    assert res.status == fault.status, (res.status, res.raw[:300])
    if fault.status != 200:
        err = assert_openai_error(res.json())
        assert err["code"] == fault.code, err
        assert res.headers["X-Speclane-Error-Source"] == "upstream"
        return
    events = res.events
    for e in events[:-1]:  # every dispatched event is whole JSON: nothing half-written
        orjson.loads(e)
    if fault.code is None:
        assert res.completed(), res.raw[-300:]
        assert b"hello " in res.raw
        return
    err = res.error_event()
    assert err is not None and err["code"] == fault.code, res.raw[-300:]


async def check_with_openai(fault: Fault, base_url: str) -> None:
    async with openai.AsyncOpenAI(
        base_url=base_url, api_key="x", max_retries=0, timeout=30
    ) as client:
        await openai_sees(fault, client)


async def openai_sees(fault: Fault, client: openai.AsyncOpenAI) -> None:
    messages = [{"role": "user", "content": "hi"}]
    if fault.code is None:
        stream = await client.chat.completions.create(
            model="fake-model", messages=messages, stream=True
        )
        assert [c async for c in stream]
        return
    with pytest.raises(openai.APIError) as info:
        if fault.stream:
            stream = await client.chat.completions.create(
                model="fake-model", messages=messages, stream=True
            )
            async for _ in stream:
                pass
        else:
            await client.chat.completions.create(model="fake-model", messages=messages)
    if fault.status != 200:
        assert isinstance(info.value, openai.APIStatusError)
        assert info.value.status_code == fault.status


@pytest.mark.parametrize("fault", FAULTS, ids=fault_id)
async def test_upstream_fault_gives_a_clear_answer_within_the_timeout(fault: Fault) -> None:
    upstream = RawUpstream(lambda r, w, b: fault.script(upstream, r, w, b), name="raw")
    await upstream.start()
    try:
        settings = router_settings(
            backends=[
                {
                    "name": "raw",
                    "base_url": upstream.base_url,
                    "read_timeout": READ_TIMEOUT,
                    "connect_timeout": 1,
                }
            ]
        )
        async with run_router(settings) as r, aiohttp.ClientSession() as s:
            started = time.monotonic()
            res = await post_stream(
                s, f"{r.base_url}/chat/completions", chat_body(stream=fault.stream)
            )
            elapsed = time.monotonic() - started
            check_answer(fault, res)
            retried = fault.status in (502, 503) and fault.code == "upstream_error"
            assert elapsed < READ_TIMEOUT * (3 if retried else 1) + SLACK, elapsed
            if fault.stalls:  # the router closed the connection: the upstream may stop
                await asyncio.wait_for(upstream.closed_event.wait(), 5)
            await check_with_openai(fault, r.base_url)
            backend = r.services.pool["raw"]
            await wait_until(lambda: backend.inflight == 0)
            assert await metric_total(s, r.url, "speclane_inflight_requests") == 0
    finally:
        await upstream.stop()
    TALLY.fault(fault_id(fault), 2)  # once with raw HTTP, once with the openai client


async def test_backend_that_never_accepts_is_a_504_within_the_timeout() -> None:
    """The port is open (kernel backlog) but nobody ever accepts the connection."""
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen(8)
        port = listener.getsockname()[1]
        settings = router_settings(
            backends=[
                {
                    "name": "deaf",
                    "base_url": f"http://127.0.0.1:{port}/v1",
                    "models": ["fake-model"],
                    "read_timeout": READ_TIMEOUT,
                    "connect_timeout": 1,
                }
            ]
        )
        async with run_router(settings) as r, aiohttp.ClientSession() as s:
            r.services.pool["deaf"].ready = True  # its health check cannot pass either
            for stream in (False, True):
                started = time.monotonic()
                res = await post_stream(
                    s, f"{r.base_url}/chat/completions", chat_body(stream=stream)
                )
                assert time.monotonic() - started < READ_TIMEOUT + SLACK
                assert res.status == 504
                assert assert_openai_error(res.json())["code"] == "upstream_timeout"
                TALLY.fault("never_accepts")
            assert r.services.pool["deaf"].inflight == 0


async def test_malformed_event_mid_stream_is_relayed_and_the_stream_still_ends() -> None:
    """Documented limit: only the first event is validated (the rest is relayed untouched,
    at no per-chunk cost). A broken event later reaches the client as is, and the stream
    still ends properly; the router neither hangs nor fails."""

    async def broken_later(up, reader, writer, body):  # type: ignore[no-untyped-def]
        writer.write(
            SSE_HEAD
            + chunk(CONTENT)
            + chunk(b"data: {broken\n\n")
            + chunk(FINISH)
            + chunk(b"data: [DONE]\n\n")
            + b"0\r\n\r\n"
        )
        await writer.drain()

    upstream = RawUpstream(lambda r, w, b: broken_later(upstream, r, w, b))
    await upstream.start()
    try:
        settings = router_settings(
            backends=[{"name": "raw", "base_url": upstream.base_url, "read_timeout": READ_TIMEOUT}]
        )
        async with run_router(settings) as r, aiohttp.ClientSession() as s:
            res = await post_stream(s, f"{r.base_url}/chat/completions", chat_body(stream=True))
    finally:
        await upstream.stop()
    assert res.status == 200 and res.terminated
    assert res.events[-1] == b"[DONE]" and b"{broken" in res.events
    TALLY.fault("malformed_event_mid_stream")


# --- a backend process killed with streams in flight ------------------------------------------


async def test_backend_killed_mid_stream_ends_every_stream_and_traffic_moves_on() -> None:
    streams = 12
    proc, match = await spawn_until_line(
        [
            sys.executable,
            "-m",
            "tests.reliability.upstream_proc",
            "--chunks",
            "5000",
            "--interval",
            "0.02",
        ],
        r"FAKE_UPSTREAM_READY (\d+)",
        deadline=60,
    )
    try:
        async with fake_upstreams("survivor") as (survivor,):
            victim = {
                "name": "victim",
                "base_url": f"http://127.0.0.1:{match.group(1)}/v1",
                "read_timeout": 5,
                "connect_timeout": 1,
            }
            settings = router_settings(
                survivor, backends=[victim, {"name": "survivor", "base_url": survivor.base_url}]
            )
            async with run_router(settings) as r, aiohttp.ClientSession() as s:
                url = f"{r.base_url}/chat/completions"
                firsts = [asyncio.Event() for _ in range(streams)]
                tasks = [
                    asyncio.create_task(
                        read_stream(
                            s, url, chat_body(stream=True), {"X-Speclane-Lane": "victim"}, first
                        )
                    )
                    for first in firsts
                ]
                await asyncio.wait_for(asyncio.gather(*(f.wait() for f in firsts)), 30)
                proc.send_signal(signal.SIGKILL)
                killed = time.monotonic()
                results = await asyncio.wait_for(asyncio.gather(*tasks), 15)
                ended = time.monotonic() - killed
                for res in results:
                    assert res.status == 200 and res.terminated
                    for e in res.events[:-1]:
                        orjson.loads(e)  # no half event before the error
                    err = res.error_event()
                    assert err is not None and err["type"] == "upstream_error", res.raw[-300:]
                assert ended < SLACK + 2
                # The next requests go elsewhere: the victim is cooled down after its failures.
                for stream in (False, True, False, True):
                    res = await post_stream(s, url, chat_body(stream=stream))
                    assert res.status == 200 and res.headers["X-Speclane-Backend"] == "survivor"
                    assert res.headers["X-Speclane-Attempts"] == "1"
                assert r.services.pool["victim"].view().cooled_down
                await wait_until(lambda: all(b.inflight == 0 for b in r.services.pool))
                assert await metric_total(s, r.url, "speclane_inflight_requests") == 0
    finally:
        await stop(proc)
    TALLY.fault("backend_killed_mid_stream", streams)


def test_sse_payload_parser_drops_an_incomplete_last_event() -> None:
    """The suite's own SSE parser dispatches like a client: the harness must not hide bugs."""
    assert sse_payloads(b"data: a\n\ndata: b\r\n\r\ndata: c") == [b"a", b"b"]
