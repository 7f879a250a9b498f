"""Hostile clients against the listening side of ``speclane serve`` (a real subprocess).

Clients that connect and say nothing, stop after half a request head, trickle a head or a
body a byte at a time, open far more connections than the cap, or send bytes that are not
HTTP; and a port already taken at start. Each must end in a clear answer (408, 503, 400)
or a closed connection, without holding descriptors, flooding the log, or a traceback.
Small limits make the tests short; nothing here asserts a measured time.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import threading
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import orjson
import pytest

from tests.fakes.upstream import Behaviour, FakeUpstream
from tests.reliability.harness import (
    TALLY,
    RouterProcess,
    assert_openai_error,
    config_text,
    eventually,
    parse_response,
    run_serve,
)

HEAD_TIMEOUT = 1.0
BODY_TIMEOUT = 1.0
KEEPALIVE = 2.5  # longer than the head deadline: a slow head gets its 408 first
CAP = 24


@contextlib.asynccontextmanager
async def serve(
    tmp: Path, behaviour: Behaviour | None = None, **limits: float
) -> AsyncIterator[RouterProcess]:
    fake = FakeUpstream(name="fake", behaviour=behaviour or Behaviour())
    await fake.start()
    policies = tmp / "policies"
    policies.mkdir(exist_ok=True)
    config = tmp / "speclane.toml"
    config.write_text(
        config_text(
            policies_dir=str(policies),
            log_level="warning",
            health_interval=600,
            client_limits=limits,
            backends=[{"name": "fake", "base_url": fake.base_url, "read_timeout": 10}],
        )
    )
    router = await RouterProcess.start(config, "--no-lanes")
    try:
        yield router
    finally:
        code = await router.stop()
        await fake.stop()
        err = "".join(router.stderr)
        assert code == 0, err[-2000:]
        assert "Traceback" not in err, err[-4000:]


@pytest.fixture
async def timed(tmp_path: Path) -> AsyncIterator[RouterProcess]:
    async with serve(
        tmp_path,
        head_timeout=HEAD_TIMEOUT,
        body_timeout=BODY_TIMEOUT,
        keepalive_timeout=KEEPALIVE,
        max_connections=500,
    ) as router:
        yield router


def connect(port: int) -> socket.socket:
    sock = socket.create_connection(("127.0.0.1", port), timeout=30)
    return sock


def read_until_closed(sock: socket.socket) -> bytes:
    """Everything the router sends until it closes the connection (socket timeout: 30 s,
    far beyond every limit here; reaching it fails the test)."""
    data = bytearray()
    with contextlib.suppress(ConnectionResetError):
        while chunk := sock.recv(65536):
            data += chunk
    return bytes(data)


@contextlib.contextmanager
def trickle(sock: socket.socket, payload: bytes, gap: float) -> Iterator[threading.Event]:
    """Send ``payload`` one byte per ``gap`` seconds in a thread until told to stop or
    until the router closes the connection."""
    stop = threading.Event()

    def run() -> None:
        for byte in payload:
            if stop.wait(gap):
                return
            try:
                sock.sendall(bytes([byte]))
            except OSError:
                return

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    try:
        yield stop
    finally:
        stop.set()
        thread.join(5)


async def in_thread(fn, *args):  # type: ignore[no-untyped-def]
    return await asyncio.to_thread(fn, *args)


# --- timeouts ------------------------------------------------------------------------------------


async def test_an_idle_connection_is_closed(timed: RouterProcess) -> None:
    def idle_then_keepalive() -> tuple[bytes, bytes]:
        # Both at once: their idle timers run side by side, not one after the other.
        with connect(timed.port) as quiet, connect(timed.port) as kept:
            kept.sendall(b"GET /healthz HTTP/1.1\r\nHost: localhost\r\n\r\n")
            after_answer = read_until_closed(kept)
            never_spoke = read_until_closed(quiet)
        return never_spoke, after_answer

    never_spoke, after_answer = await in_thread(idle_then_keepalive)
    assert never_spoke == b""  # closed without a word
    assert after_answer.startswith(b"HTTP/1.1 200")  # answered, then closed when idle
    TALLY.fault("client_idle", 2)


async def test_a_trickled_request_head_gets_408(timed: RouterProcess) -> None:
    head = b"POST /v1/chat/completions HTTP/1.1\r\nHost: localhost\r\nX-Slow: " + b"a" * 4000

    def slow_head() -> bytes:
        with connect(timed.port) as sock, trickle(sock, head, 0.05):
            return read_until_closed(sock)

    answer = await in_thread(slow_head)
    resp = parse_response(answer)
    assert resp.status == 408
    assert assert_openai_error(orjson.loads(resp.body))["code"] == "request_timeout"
    TALLY.fault("client_slow_head")


async def test_a_trickled_request_body_gets_408(timed: RouterProcess) -> None:
    body = orjson.dumps(
        {"model": "fake-model", "messages": [{"role": "user", "content": "x" * 2000}]}
    )
    head = (
        b"POST /v1/chat/completions HTTP/1.1\r\nHost: localhost\r\n"
        b"Content-Type: application/json\r\nContent-Length: %d\r\n\r\n" % len(body)
    )

    def slow_body() -> bytes:
        with connect(timed.port) as sock:
            sock.sendall(head)
            with trickle(sock, body, 0.05):
                return read_until_closed(sock)

    resp = parse_response(await in_thread(slow_body))
    assert resp.status == 408
    err = assert_openai_error(orjson.loads(resp.body))
    assert err["code"] == "request_timeout" and "body" in err["message"]
    TALLY.fault("client_slow_body")


async def test_many_slow_clients_hold_no_descriptors(timed: RouterProcess) -> None:
    """A slow-loris crowd: half-written heads on 200 connections. All are answered 408 and
    closed; the router's descriptors come back to where they were; it still serves."""
    baseline = timed.ps.num_fds()

    def crowd() -> list[bytes]:
        socks = []
        try:
            for _ in range(200):  # each says half a head at once (else it is merely idle)
                socks.append(connect(timed.port))
                socks[-1].sendall(b"GET /healthz HTTP/1.1\r\nHost: localhost\r\nX-Half: ")
            return [read_until_closed(s) for s in socks]
        finally:
            for s in socks:
                s.close()

    answers = await in_thread(crowd)
    assert all(a.startswith(b"HTTP/1.1 408") for a in answers), {a[:40] for a in answers}

    async def back_to_baseline() -> bool:
        return timed.ps.num_fds() <= baseline + 4

    await eventually(back_to_baseline, what="router descriptors back to baseline")
    ok = await in_thread(lambda: _get(timed.port, "/healthz"))
    assert ok.startswith(b"HTTP/1.1 200")
    TALLY.fault("client_slowloris_crowd", 200)


def _get(port: int, path: str) -> bytes:
    with connect(port) as sock:
        sock.sendall(
            f"GET {path} HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n".encode()
        )
        return read_until_closed(sock)


async def test_a_long_answer_is_not_cut_by_the_head_deadline_of_a_pipelined_request(
    tmp_path: Path,
) -> None:
    """A stream that lasts longer than every client limit, with half of a next request
    already sent behind it: the stream ends whole; only then is the half head refused."""
    slow = Behaviour(chunks=12, interval=0.25)  # about 3 s: past head and idle deadlines
    async with serve(
        tmp_path,
        slow,
        head_timeout=HEAD_TIMEOUT,
        keepalive_timeout=KEEPALIVE,
        body_timeout=BODY_TIMEOUT,
    ) as router:
        body = orjson.dumps(
            {"model": "fake-model", "stream": True, "messages": [{"role": "user", "content": "hi"}]}
        )
        request = (
            b"POST /v1/chat/completions HTTP/1.1\r\nHost: localhost\r\n"
            b"Content-Type: application/json\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body)
        )

        def pipelined() -> bytes:
            with connect(router.port) as sock:
                sock.sendall(request)
                data = sock.recv(65536)  # the stream has begun: now half a next request
                sock.sendall(b"GET /healthz HTTP/1.1\r\nHost: localhost\r\n")
                return data + read_until_closed(sock)

        data = await in_thread(pipelined)
    first, _, rest = data.partition(b"0\r\n\r\n")  # the stream's last chunk
    assert first.startswith(b"HTTP/1.1 200") and b"data: [DONE]" in first, data[-300:]
    assert first.count(b'"content"') >= 12, first[-500:]  # every chunk arrived
    assert rest.startswith(b"HTTP/1.1 408"), rest[:200]  # then the half head's deadline
    TALLY.fault("client_pipelined_half_head")


# --- the connection cap --------------------------------------------------------------------------


async def test_connections_beyond_the_cap_get_503_and_descriptors_stay_bounded(
    tmp_path: Path,
) -> None:
    async with serve(
        tmp_path, head_timeout=60, keepalive_timeout=60, max_connections=CAP
    ) as router:
        baseline = router.ps.num_fds()

        def flood() -> tuple[list[bytes], int]:
            held = [connect(router.port) for _ in range(CAP)]
            try:
                # Each held connection is in: it gets an answer (and stays open).
                for s in held:
                    s.sendall(b"GET /healthz HTTP/1.1\r\nHost: localhost\r\n\r\n")
                for s in held:
                    assert s.recv(65536).startswith(b"HTTP/1.1 200")
                refused = []
                for _ in range(300):
                    with connect(router.port) as extra:
                        refused.append(read_until_closed(extra))
                fds = router.ps.num_fds()
            finally:
                for s in held:
                    s.close()
            return refused, fds

        refused, fds_during = await in_thread(flood)
        for answer in refused:
            resp = parse_response(answer)
            assert resp.status == 503 and resp.header("Retry-After") == "1"
            assert assert_openai_error(orjson.loads(resp.body))["code"] == "too_many_connections"
        assert fds_during <= baseline + CAP + 8  # the refused ones hold nothing

        async def serving_again() -> bool:
            answer = await in_thread(lambda: _get(router.port, "/healthz"))
            return answer.startswith(b"HTTP/1.1 200")

        await eventually(serving_again, what="router serving again below the cap")
        warnings = [ln for ln in router.stderr if "client connection refused" in ln]
        assert 1 <= len(warnings) <= 3  # rate-limited, not one line per refusal
        TALLY.fault("client_over_cap", len(refused))


# --- bytes that are not HTTP ---------------------------------------------------------------------


async def test_malformed_requests_log_one_rate_limited_warning_not_tracebacks(
    timed: RouterProcess,
) -> None:
    bad = [
        b"GARBAGE\r\n\r\n",
        b"GET / HTTP/1.1\r\nHost: localhost\r\nBad\rHeader: y\r\n\r\n",
        b"GET /healthz HTTP/1.1\r\nX: " + b"a" * 9000 + b"\r\n\r\n",
        b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03" + bytes(range(64)),  # TLS hello
        b"POST /v1/chat/completions HTTP/1.1\r\nContent-Length: 5\r\n"
        b"Transfer-Encoding: chunked\r\n\r\n0\r\n\r\n",
    ]

    def send_all() -> tuple[list[bytes], float]:
        out = []
        started = time.monotonic()
        for _ in range(20):
            for request in bad:
                with connect(timed.port) as sock:
                    with contextlib.suppress(OSError):
                        sock.sendall(request)
                    out.append(read_until_closed(sock))
        return out, time.monotonic() - started

    answers, took = await in_thread(send_all)
    for answer in answers:
        if answer:  # a TLS hello may be cut off without an answer
            resp = parse_response(answer)
            assert resp.status == 400, answer[:200]
            assert_openai_error(orjson.loads(resp.body))
    err_lines = [ln for ln in timed.stderr if " ERROR " in ln or "Traceback" in ln]
    assert not err_lines, err_lines[:5]
    warnings = [ln for ln in timed.stderr if "malformed request" in ln]
    # At most one line a second (and one more for the second it started in), however
    # fast the requests came.
    assert 1 <= len(warnings) <= int(took) + 2, (len(warnings), took)
    TALLY.fault("client_malformed_http", len(answers))


# --- start-up ------------------------------------------------------------------------------------


async def test_a_port_in_use_is_one_clear_line_and_exit_1(tmp_path: Path) -> None:
    taken = socket.socket()
    taken.bind(("127.0.0.1", 0))
    taken.listen()
    port = taken.getsockname()[1]
    try:
        (tmp_path / "policies").mkdir()
        config = tmp_path / "speclane.toml"
        config.write_text(config_text(policies_dir=str(tmp_path / "policies")))
        code, _, err = await run_serve("--config", str(config), "--no-lanes", "--port", str(port))
    finally:
        taken.close()
    assert code == 1
    assert "Traceback" not in err
    lines = [ln for ln in err.splitlines() if "could not start" in ln]
    assert len(lines) == 1 and f"127.0.0.1:{port}" in lines[0] and "in use" in lines[0]
    TALLY.fault("port_in_use")
