"""Hostile upstreams, one class of misbehaviour per test, judged by what clients see.

- Bytes after an answer never reach another request (many clients at once, counted).
- A decoded body is bounded (a gzip bomb is a 502, and memory does not follow it).
- A paused or half-read connection is never pooled.
- A head has its own deadline (trickled head bytes, endless ``100 Continue``); trailers are
  bounded and never add a second ending to a stream.
- Framing and status faults are a 502 that is not retried, counted under its own reason;
  connections whose framing is doubtful are not reused.
- ``still_working`` re-arms the silence timeout while the upstream says it is busy.
"""

from __future__ import annotations

import asyncio
import zlib
from collections import Counter
from typing import Any

import aiohttp
import orjson
import psutil
import pytest

from router.upstream.client import Http1Pool, UpstreamTooLarge
from tests.conftest import router_settings, run_router, wait_until
from tests.reliability.harness import (
    TALLY,
    assert_openai_error,
    chat_body,
    metric_total,
    post_stream,
)
from tests.reliability.hostile_upstream import HostileUpstream, chunk, json_answer

SSE_HEAD = (
    b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n"
)
HANG = 60.0  # a guard against hanging, not a speed claim


def marker_of(body: bytes) -> str:
    return str(orjson.loads(body)["messages"][0]["content"])


def completion(marker: str) -> bytes:
    return orjson.dumps(
        {
            "id": marker,
            "object": "chat.completion",
            "created": 0,
            "model": "m",
            "choices": [
                {
                    "index": 0,
                    "finish_reason": "stop",
                    "message": {"role": "assistant", "content": marker},
                }
            ],
        }
    )


def content_event(text: str) -> bytes:
    return (
        b"data: "
        + orjson.dumps(
            {
                "id": "c",
                "object": "chat.completion.chunk",
                "created": 0,
                "model": "m",
                "choices": [{"index": 0, "delta": {"content": text}, "finish_reason": None}],
            }
        )
        + b"\n\n"
    )


def stream_of(marker: str) -> bytes:
    return SSE_HEAD + chunk(content_event(marker)) + chunk(b"data: [DONE]\n\n") + b"0\r\n\r\n"


def settings_for(
    *ups: HostileUpstream, read_timeout: float = 5.0, attempts: int = 1, **overrides: Any
) -> Any:
    s = router_settings(*ups, **overrides)
    backends = tuple(b.model_copy(update={"read_timeout": read_timeout}) for b in s.backends)
    return s.model_copy(
        update={"backends": backends, "retry": s.retry.model_copy(update={"attempts": attempts})}
    )


async def post(session: aiohttp.ClientSession, url: str, body: dict[str, Any]) -> Any:
    return await asyncio.wait_for(post_stream(session, f"{url}/v1/chat/completions", body), HANG)


# --- 1. no byte of one answer reaches another request ------------------------------------


@pytest.mark.parametrize("stream", [False, True])
@pytest.mark.parametrize("how", ["same_write", "next_write", "delayed"])
async def test_bytes_after_an_answer_never_reach_another_request(stream: bool, how: str) -> None:
    """Every answer is followed on its connection by a complete second answer carrying a
    wrong id, in the same write or the next one. With several clients at once, no client
    ever gets an answer that is not its own."""

    async def script(writer: asyncio.StreamWriter, body: bytes, index: int) -> bool:
        marker = marker_of(body)
        answer = stream_of(marker) if stream else json_answer(completion(marker))
        stray = stream_of("stray") if stream else json_answer(completion("stray"))
        if how == "same_write":
            writer.write(answer + stray)
        else:
            writer.write(answer)
            await writer.drain()
            if how == "delayed":
                await asyncio.sleep(0.0005 * (index % 4))
            writer.write(stray)
        await writer.drain()
        return True

    clients, per_client = 6, 15
    mismatched = 0
    statuses: Counter[int] = Counter()
    async with HostileUpstream(script) as up, run_router(settings_for(up)) as r:
        url = f"http://127.0.0.1:{r.port}"

        async def one_client(c: int) -> None:
            nonlocal mismatched
            async with aiohttp.ClientSession() as session:
                for i in range(per_client):
                    marker = f"client{c}-req{i}"
                    res = await post(session, url, chat_body(stream=stream, content=marker))
                    statuses[res.status] += 1
                    if res.status != 200:
                        continue
                    got = (
                        orjson.loads(res.events[0])["choices"][0]["delta"]["content"]
                        if stream
                        else res.json()["id"]
                    )
                    if got != marker:
                        mismatched += 1

        await asyncio.gather(*(one_client(c) for c in range(clients)))
    print(
        f"stray-answer test ({how}, stream={stream}): {clients * per_client} answers, "
        f"{mismatched} mismatched, statuses {dict(statuses)}, "
        f"{up.connections} upstream connections"
    )
    TALLY.fault(f"stray_answer_{how}", clients * per_client)
    assert mismatched == 0
    assert statuses == {200: clients * per_client}
    # No connection that carried a stray answer was reused.
    assert up.request_connections == up.requests


# --- 2. bounded decoded bodies ------------------------------------------------------------


def _bomb(size: int) -> bytes:
    z = zlib.compressobj(9, zlib.DEFLATED, 31)  # gzip
    zeros = b"\0" * (1 << 20)
    return b"".join([z.compress(zeros) for _ in range(size >> 20)] + [z.flush()])


@pytest.mark.parametrize("stream", [False, True])
async def test_a_gzip_bomb_is_a_502_and_memory_does_not_follow(stream: bool) -> None:
    bomb = _bomb(512 << 20)  # 512 MiB of zeros in about half a megabyte
    ctype = b"text/event-stream" if stream else b"application/json"

    async def script(writer: asyncio.StreamWriter, body: bytes, index: int) -> bool:
        writer.write(
            b"HTTP/1.1 200 OK\r\nContent-Type: " + ctype + b"\r\n"
            b"Content-Encoding: gzip\r\nContent-Length: %d\r\n\r\n" % len(bomb) + bomb
        )
        await writer.drain()
        return True

    me = psutil.Process()
    limit = 4 << 20
    async with (
        HostileUpstream(script) as up,
        run_router(settings_for(up, upstream={"max_body_bytes": limit})) as r,
        aiohttp.ClientSession() as session,
    ):
        before = me.memory_info().rss
        res = await post(session, f"http://127.0.0.1:{r.port}", chat_body(stream=stream))
        grown = me.memory_info().rss - before
    print(
        f"gzip bomb ({len(bomb)} bytes, 512 MiB inflated), stream={stream}: "
        f"{res.status}, RSS +{grown / 1e6:.1f} MB"
    )
    TALLY.fault("gzip_bomb")
    if stream and res.status == 200:  # zeros are not SSE: refused before the first byte
        raise AssertionError(res.raw[:200])
    assert res.status == 502
    err = assert_openai_error(res.json())
    if not stream:
        assert err["code"] == "upstream_too_large" and "bytes" in err["message"], err
    assert grown < 40e6


async def test_the_body_bound_holds_for_plain_bodies_too() -> None:
    async with HostileUpstream(lambda w, b, i: _answer(w, json_answer(b"[" * (2 << 20)))) as up:
        pool = Http1Pool(max_body=1 << 20)
        try:
            resp = await pool.request(
                "POST", f"{up.base_url}/chat/completions", body=b"{}", read_timeout=5
            )
            with pytest.raises(UpstreamTooLarge):
                await resp.read()
        finally:
            await pool.close()


async def _answer(writer: asyncio.StreamWriter, raw: bytes, keep: bool = True) -> bool:
    writer.write(raw)
    await writer.drain()
    return keep


# --- 3. paused or half-read connections are never pooled ---------------------------------


@pytest.mark.parametrize("size", [(1 << 20) + 100_000, 3 << 20], ids=["whole", "cut"])
async def test_a_paused_connection_is_never_pooled(size: int) -> None:
    """An answer big enough to pause reading (whole by then, or not), abandoned by its
    reader (a client that went away): the next request gets a new connection and its
    answer (a paused connection reused would never deliver it)."""
    big = b"x" * size
    served = [0]

    async def script(writer: asyncio.StreamWriter, body: bytes, index: int) -> bool:
        served[0] += 1
        return await _answer(writer, json_answer(completion("next") if served[0] > 1 else big))

    async with HostileUpstream(script) as up:
        pool = Http1Pool()
        try:
            url = f"{up.base_url}/chat/completions"
            resp = await pool.request("POST", url, body=b"{}", read_timeout=5)
            conn = resp._conn
            assert conn is not None
            await wait_until(lambda: resp._paused, HANG)
            resp.close()  # the client went away while reading was paused
            for _ in range(3):
                again = await asyncio.wait_for(
                    pool.request("POST", url, body=b"{}", read_timeout=2), HANG
                )
                assert again._conn is not conn
                assert orjson.loads(await again.read())["id"] == "next"
        finally:
            await pool.close()
    assert up.request_connections == 2  # the paused one, then one reused for the rest
    TALLY.fault("paused_connection")


async def test_a_client_leaving_a_fast_big_stream_leaves_no_stuck_connection() -> None:
    """Through the router: a client reads a little of a large stream and leaves; every
    request after it is answered (a paused connection in the pool would make it a 504)."""
    filler = content_event("y" * 4000)

    async def script(writer: asyncio.StreamWriter, body: bytes, index: int) -> bool:
        if marker_of(body) == "big":
            raw = SSE_HEAD + chunk(filler) * 800 + chunk(b"data: [DONE]\n\n") + b"0\r\n\r\n"
        else:
            raw = stream_of(marker_of(body))
        return await _answer(writer, raw)

    async with (
        HostileUpstream(script) as up,
        run_router(settings_for(up, read_timeout=2)) as r,
        aiohttp.ClientSession() as session,
    ):
        url = f"http://127.0.0.1:{r.port}/v1/chat/completions"
        async with session.post(url, json=chat_body(stream=True, content="big")) as resp:
            await resp.content.read(10)
        for i in range(5):
            res = await post(
                session, f"http://127.0.0.1:{r.port}", chat_body(stream=True, content=f"after{i}")
            )
            assert res.status == 200 and res.completed(), res.raw[:200]
    TALLY.fault("client_left_big_stream")


# --- 4. the head's own deadline, interim answers, trailers --------------------------------


async def test_a_trickled_head_ends_at_the_head_deadline() -> None:
    async def script(writer: asyncio.StreamWriter, body: bytes, index: int) -> bool:
        writer.write(b"HTTP/1.1 200 OK\r\nX-Slow: ")
        while True:  # one byte well within the read timeout, forever
            writer.write(b"a")
            await writer.drain()
            await asyncio.sleep(0.05)

    async with (
        HostileUpstream(script) as up,
        run_router(settings_for(up, read_timeout=2, upstream={"head_timeout": 0.5})) as r,
        aiohttp.ClientSession() as session,
    ):
        res = await post(session, f"http://127.0.0.1:{r.port}", chat_body())
    assert res.status == 504, res.raw[:200]
    assert assert_openai_error(res.json())["code"] == "upstream_timeout"
    TALLY.fault("trickled_head")


async def test_endless_interim_answers_are_counted_and_refused() -> None:
    async def script(writer: asyncio.StreamWriter, body: bytes, index: int) -> bool:
        while True:
            writer.write(b"HTTP/1.1 100 Continue\r\n\r\n")
            await writer.drain()
            await asyncio.sleep(0.01)

    async with (
        HostileUpstream(script) as up,
        run_router(settings_for(up)) as r,
        aiohttp.ClientSession() as session,
    ):
        res = await post(session, f"http://127.0.0.1:{r.port}", chat_body(stream=True))
    assert res.status == 502, res.raw[:200]
    assert "interim" in assert_openai_error(res.json())["message"]
    TALLY.fault("endless_100_continue")


@pytest.mark.parametrize("trickle", [False, True])
async def test_endless_trailers_never_add_a_second_ending(trickle: bool) -> None:
    async def script(writer: asyncio.StreamWriter, body: bytes, index: int) -> bool:
        writer.write(SSE_HEAD + chunk(content_event("hi")) + chunk(b"data: [DONE]\n\n") + b"0\r\n")
        while True:
            writer.write(b"X-T: v\r\n" if not trickle else b"x")
            await writer.drain()
            await asyncio.sleep(0.001 if not trickle else 0.05)

    async with (
        HostileUpstream(script) as up,
        run_router(settings_for(up, read_timeout=2, upstream={"head_timeout": 0.5})) as r,
        aiohttp.ClientSession() as session,
    ):
        for _ in range(2):
            res = await post(session, f"http://127.0.0.1:{r.port}", chat_body(stream=True))
            assert res.status == 200 and res.terminated
            assert res.events.count(b"[DONE]") == 1, res.raw
            assert res.completed(), res.raw
    TALLY.fault("endless_trailers")


@pytest.mark.parametrize("trickle", [False, True])
async def test_endless_trailers_on_a_json_answer_are_bounded(trickle: bool) -> None:
    async def script(writer: asyncio.StreamWriter, body: bytes, index: int) -> bool:
        payload = completion("x")
        writer.write(
            b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
            b"Transfer-Encoding: chunked\r\n\r\n" + chunk(payload) + b"0\r\n"
        )
        while True:
            writer.write(b"X-T: v\r\n" * 512 if not trickle else b"x")
            await writer.drain()
            await asyncio.sleep(0.001 if not trickle else 0.05)

    async with (
        HostileUpstream(script) as up,
        run_router(settings_for(up, read_timeout=2, upstream={"head_timeout": 0.5})) as r,
        aiohttp.ClientSession() as session,
    ):
        res = await post(session, f"http://127.0.0.1:{r.port}", chat_body())
    # Fast trailers hit the size bound (502), trickled ones the deadline (504).
    assert res.status == (504 if trickle else 502), res.raw[:200]
    assert_openai_error(res.json())
    TALLY.fault("endless_trailers_json")


# --- 5. framing and status faults: 502, not retried, own reason, never reused -------------

MALFORMED = {
    "status_099": b"HTTP/1.1 099 Odd\r\nContent-Length: 0\r\n\r\n",
    "status_000": b"HTTP/1.1 000 Odd\r\nContent-Length: 0\r\n\r\n",
    "status_9999": b"HTTP/1.1 9999 Odd\r\nContent-Length: 0\r\n\r\n",
    "status_600": b"HTTP/1.1 600 Odd\r\nContent-Length: 0\r\n\r\n",
    "status_superscript": "HTTP/1.1 2²0 OK\r\nContent-Length: 0\r\n\r\n".encode(),
    "length_superscript": "HTTP/1.1 200 OK\r\nContent-Length: ²\r\n\r\n{}".encode(),
    "cl_and_te": (
        b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nTransfer-Encoding: chunked\r\n\r\n"
        b"2\r\n{}\r\n0\r\n\r\n"
    ),
    "xchunked": b"HTTP/1.1 200 OK\r\nTransfer-Encoding: xchunked\r\n\r\n2\r\n{}\r\n0\r\n\r\n",
    "bad_chunk_size": b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n0x2\r\n{}\r\n",
    "http2_version": b"HTTP/2.0 200 OK\r\nContent-Length: 2\r\n\r\n{}",
    "switching_protocols": b"HTTP/1.1 101 Switching Protocols\r\n\r\n",
    "json_array": json_answer(b"[1, 2]"),
    "head_cut_then_close": b"HTTP/1.1 200 OK\r\nContent-Ty",
    "interim_then_close": b"HTTP/1.1 100 Continue\r\n\r\n",
}


@pytest.mark.parametrize("name", sorted(MALFORMED))
async def test_a_malformed_answer_is_a_502_not_retried(name: str) -> None:
    raw = MALFORMED[name]

    async def bad(writer: asyncio.StreamWriter, body: bytes, index: int) -> bool:
        return await _answer(writer, raw, keep=not name.endswith("_then_close"))

    # Two backends and three attempts allowed: a retry would show as a second request.
    async with (
        HostileUpstream(bad, "bad") as up,
        HostileUpstream(bad, "bad2") as other,
        run_router(settings_for(up, other, attempts=3)) as r,
        aiohttp.ClientSession() as session,
    ):
        url = f"http://127.0.0.1:{r.port}"
        res = await post(session, url, chat_body())
        backend = res.headers.get("X-Speclane-Backend")
        assert up.requests + other.requests == 1
        assert res.status == 502, (res.status, res.raw[:200])
        err = assert_openai_error(res.json())
        assert err["code"] in ("upstream_malformed", "upstream_bad_json"), err
        # The X-Speclane-* headers known at that point are on the error answer too.
        for header in (
            "X-Speclane-Client",
            "X-Speclane-Decision",
            "X-Speclane-Attempts",
            "X-Speclane-Backend",
            "X-Speclane-Error-Source",
        ):
            assert header in res.headers, (header, res.headers)
        assert res.headers["X-Speclane-Attempts"] == "1"  # not retried
        assert res.headers["X-Speclane-Error-Source"] == "upstream"
        if err["code"] == "upstream_malformed":
            # A failure under its own reason, never repeated (so no retry is counted).
            assert (
                await metric_total(
                    session,
                    url,
                    "speclane_upstream_failures_total",
                    backend=backend,
                    reason="malformed",
                )
                == 1
            )
            assert (
                await metric_total(
                    session, url, "speclane_upstream_failures_total", reason="connect"
                )
                == 0
            )
            assert await metric_total(session, url, "speclane_upstream_retries_total") == 0
    TALLY.fault(f"malformed_{name}")


@pytest.mark.parametrize(
    "raw",
    [
        b"HTTP/1.0 200 OK\r\nConnection: keep-alive\r\nTransfer-Encoding: chunked\r\n"
        b"Content-Type: application/json\r\n\r\n%s0\r\n\r\n",
        b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s\r\n",
    ],
    ids=["http10_chunked", "crlf_after_body"],
)
async def test_doubtful_framing_is_never_reused(raw: bytes) -> None:
    async def script(writer: asyncio.StreamWriter, body: bytes, index: int) -> bool:
        payload = completion(marker_of(body))
        if raw.startswith(b"HTTP/1.0"):
            answer = raw % chunk(payload)
        else:
            answer = raw % (len(payload), payload)
        return await _answer(writer, answer)

    async with (
        HostileUpstream(script) as up,
        run_router(settings_for(up)) as r,
        aiohttp.ClientSession() as session,
    ):
        for i in range(3):
            res = await post(session, f"http://127.0.0.1:{r.port}", chat_body(content=f"m{i}"))
            assert res.status == 200 and res.json()["id"] == f"m{i}"
    if raw.startswith(b"HTTP/1.0"):
        assert up.request_connections == up.requests == 3
    TALLY.fault("doubtful_framing")


async def test_sse_in_tiny_tcp_pieces_is_relayed() -> None:
    """Valid SSE arriving a few bytes per TCP segment is judged by its first whole event."""

    async def script(writer: asyncio.StreamWriter, body: bytes, index: int) -> bool:
        writer.write(SSE_HEAD)
        data = content_event("piecewise") + b"data: [DONE]\n\n"
        for i in range(0, len(data), 3):
            writer.write(chunk(data[i : i + 3]))
            await writer.drain()
            await asyncio.sleep(0.002)
        writer.write(b"0\r\n\r\n")
        await writer.drain()
        return True

    async with (
        HostileUpstream(script) as up,
        run_router(settings_for(up)) as r,
        aiohttp.ClientSession() as session,
    ):
        res = await post(session, f"http://127.0.0.1:{r.port}", chat_body(stream=True))
    assert res.status == 200 and res.completed(), res.raw[:300]
    assert b"piecewise" in res.raw
    TALLY.fault("sse_tiny_pieces")


# --- 8. the still_working hook -------------------------------------------------------------


@pytest.mark.parametrize("busy", [True, False])
async def test_still_working_re_arms_the_silence_timeout(busy: bool) -> None:
    answered = asyncio.Event()
    asked: list[int] = []

    async def script(writer: asyncio.StreamWriter, body: bytes, index: int) -> bool:
        await answered.wait()  # silent until the callback has been asked three times
        return await _answer(writer, json_answer(completion("late")))

    async def still_working() -> bool:
        asked.append(1)
        if len(asked) >= 3:
            answered.set()
        return busy

    async with HostileUpstream(script) as up:
        pool = Http1Pool()
        try:
            coro = pool.request(
                "POST",
                f"{up.base_url}/chat/completions",
                body=b"{}",
                read_timeout=0.05,
                still_working=still_working,
            )
            if busy:
                resp = await asyncio.wait_for(coro, HANG)
                assert orjson.loads(await resp.read())["id"] == "late"
                assert len(asked) >= 3
            else:
                with pytest.raises(TimeoutError):
                    await asyncio.wait_for(coro, HANG)
                assert len(asked) == 1
        finally:
            answered.set()
            await pool.close()


async def test_a_failing_still_working_callback_is_a_timeout() -> None:
    async def script(writer: asyncio.StreamWriter, body: bytes, index: int) -> bool:
        await asyncio.sleep(HANG)
        return False

    async def broken() -> bool:
        raise RuntimeError("lane status unknown")

    async with HostileUpstream(script) as up:
        pool = Http1Pool()
        try:
            with pytest.raises(TimeoutError):
                await asyncio.wait_for(
                    pool.request(
                        "POST",
                        f"{up.base_url}/chat/completions",
                        body=b"{}",
                        read_timeout=0.05,
                        still_working=broken,
                    ),
                    HANG,
                )
        finally:
            await pool.close()


async def test_an_upstream_that_sent_a_late_stray_answer_loses_keep_alive() -> None:
    """A stray answer that comes while its connection sits in the pool closes it, and the
    upstream's connections are not reused any more: a later stray could otherwise arrive
    just after the next request was sent on one, where nothing can tell it apart."""
    sent_stray = asyncio.Event()

    async def script(writer: asyncio.StreamWriter, body: bytes, index: int) -> bool:
        await _answer(writer, json_answer(completion(body.decode())))
        if not sent_stray.is_set():
            await asyncio.sleep(0.05)
            sent_stray.set()
            await _answer(writer, json_answer(completion("stray")))
        return True

    async with HostileUpstream(script) as up:
        pool = Http1Pool()
        try:
            url = f"{up.base_url}/chat/completions"
            for i in range(4):
                resp = await pool.request("POST", url, body=b"m%d" % i, read_timeout=5)
                assert orjson.loads(await resp.read())["id"] == f"m{i}"
                if i == 0:
                    await sent_stray.wait()
                    await wait_until(lambda: pool.distrusted, HANG)
        finally:
            await pool.close()
    assert up.request_connections == up.requests == 4
    TALLY.fault("late_stray_answer")


async def test_answers_leave_nothing_behind_for_the_collector() -> None:
    """Each answer's parser is freed when the answer is done, by reference counting alone:
    with the collector's thresholds raised (as speclane runs), cycles would pile up."""
    import gc

    from router.upstream.http_response import ResponseParser

    async def script(writer: asyncio.StreamWriter, body: bytes, index: int) -> bool:
        return await _answer(writer, stream_of("x") if index % 2 else json_answer(b"{}"))

    def parsers() -> int:
        return sum(isinstance(o, ResponseParser) for o in gc.get_objects())

    async with HostileUpstream(script) as up:
        pool = Http1Pool()
        gc.collect()
        gc.disable()
        try:
            before = parsers()
            for _ in range(50):
                resp = await pool.request(
                    "POST", f"{up.base_url}/chat/completions", body=b"{}", read_timeout=5
                )
                await resp.read()
                resp.close()
            del resp
            assert parsers() - before <= 1
        finally:
            gc.enable()
            await pool.close()
