"""Shared pieces of the reliability suite.

- ``TALLY``: what the suite tried (faults injected, fuzz cases, load requests, peak RSS);
  ``conftest.py`` prints it at the end of the run and writes it as JSON when
  ``SPECLANE_RELIABILITY_JSON`` names a file (the figures of examples/results/reliability.md
  come from there).
- ``RouterProcess``: ``python -m router serve`` as a real subprocess, for SIGTERM, start-up
  errors, and the fuzz and load targets (a crash or a leak then shows in its own process).
- ``RawUpstream``: a TCP server that misbehaves below HTTP (never answers, headers then
  silence, a body cut short), for faults an aiohttp server cannot be made to produce.
- ``LoopThread``: an event loop in a thread, so synchronous hypothesis tests can drive
  async fakes.
- raw HTTP (bytes in, bytes out: invalid UTF-8, injected header lines), SSE parsing, and
  the OpenAI error-shape check every answer of the suite goes through.
"""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import json
import os
import re
import signal
import socket
import sys
import threading
import time
from collections import Counter
from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import aiohttp
import orjson
import psutil
from aiohttp import web

from router.app import Wired, wire
from router.config.settings import Settings
from router.proxy.services import Services
from tests.fakes.loopback import LoopbackServer

REPO = Path(__file__).resolve().parents[2]
T = TypeVar("T")


# --- what the suite tried ---------------------------------------------------------------------


@dataclass
class Tally:
    faults: Counter[str] = field(default_factory=Counter)  # fault kind -> injections checked
    fuzz: Counter[str] = field(default_factory=Counter)  # fuzz family -> requests sent
    fuzz_status: Counter[int] = field(default_factory=Counter)  # status -> answers
    fuzz_router_5xx: int = 0
    fuzz_sides: Counter[str] = field(default_factory=Counter)  # "client" / "upstream" -> cases
    load: dict[str, Any] = field(default_factory=dict)
    shutdown: dict[str, Any] = field(default_factory=dict)
    memory: dict[str, Any] = field(default_factory=dict)

    def fault(self, kind: str, count: int = 1) -> None:
        self.faults[kind] += count

    def as_dict(self) -> dict[str, Any]:
        return {
            "faults": {
                "total": sum(self.faults.values()),
                "kinds": len(self.faults),
                "by_kind": dict(sorted(self.faults.items())),
            },
            "fuzz": {
                "total": sum(self.fuzz.values()),
                "by_family": dict(sorted(self.fuzz.items())),
                "by_status": {str(k): v for k, v in sorted(self.fuzz_status.items())},
                "router_5xx": self.fuzz_router_5xx,
                "by_side": dict(sorted(self.fuzz_sides.items())),
            },
            "load": self.load,
            "shutdown": self.shutdown,
            "memory": self.memory,
        }

    def merge(self, other: dict[str, Any]) -> None:
        """Add another process's tally (its ``as_dict``): pytest-xdist's workers each keep one."""
        self.faults.update(other["faults"]["by_kind"])
        fuzz = other["fuzz"]
        self.fuzz.update(fuzz["by_family"])
        self.fuzz_status.update({int(k): v for k, v in fuzz["by_status"].items()})
        self.fuzz_router_5xx += fuzz["router_5xx"]
        self.fuzz_sides.update(fuzz["by_side"])
        self.load.update(other["load"])
        self.shutdown.update(other["shutdown"])
        self.memory.update(other["memory"])

    def lines(self) -> list[str]:
        out = []
        if self.faults:
            kinds = ", ".join(f"{k}={v}" for k, v in sorted(self.faults.items()))
            out.append(
                f"faults injected: {sum(self.faults.values())} across "
                f"{len(self.faults)} kinds ({kinds})"
            )
        if self.fuzz:
            families = ", ".join(f"{k}={v}" for k, v in sorted(self.fuzz.items()))
            statuses = ", ".join(f"{k}: {v}" for k, v in sorted(self.fuzz_status.items()))
            sides = ", ".join(f"{k} side: {v}" for k, v in sorted(self.fuzz_sides.items()))
            out.append(
                f"fuzz cases: {sum(self.fuzz.values())} ({sides}) ({families}); answers "
                f"{statuses}; 5xx from the router's own code: {self.fuzz_router_5xx}"
            )
        if self.memory:
            out.append("fuzz memory: " + ", ".join(f"{k}={v}" for k, v in self.memory.items()))
        if self.shutdown:
            out.append("SIGTERM: " + ", ".join(f"{k}={v}" for k, v in self.shutdown.items()))
        if self.load:
            out.append("load: " + ", ".join(f"{k}={v}" for k, v in self.load.items()))
        return out


TALLY = Tally()


# --- OpenAI error shape and SSE ---------------------------------------------------------------


def assert_openai_error(body: Any) -> dict[str, Any]:
    """``{"error": {"message", "type", "param", "code"}}`` with a non-empty message."""
    assert isinstance(body, dict) and set(body) == {"error"}, body
    err = body["error"]
    assert isinstance(err, dict) and set(err) == {"message", "type", "param", "code"}, err
    assert isinstance(err["message"], str) and err["message"], err
    assert isinstance(err["type"], str) and err["type"], err
    return err


def sse_payloads(raw: bytes) -> list[bytes]:
    """The ``data:`` payloads of every complete event, as an SSE client would dispatch them."""
    text = raw.replace(b"\r\n", b"\n").replace(b"\r", b"\n")
    events = text.split(b"\n\n")
    payloads = []
    for event in events[:-1]:  # the last piece is incomplete (or empty): never dispatched
        lines = [ln[5:].removeprefix(b" ") for ln in event.split(b"\n") if ln.startswith(b"data:")]
        if lines:
            payloads.append(b"\n".join(lines))
    return payloads


@dataclass
class StreamResult:
    status: int
    headers: dict[str, str]
    raw: bytes
    terminated: bool  # the body ended cleanly (chunked terminator / length), not cut

    @property
    def events(self) -> list[bytes]:
        return sse_payloads(self.raw)

    def json(self) -> Any:
        return orjson.loads(self.raw)

    def error_event(self) -> dict[str, Any] | None:
        """The OpenAI-shape error that ends the stream (followed by [DONE]), if any."""
        events = self.events
        if len(events) < 2 or events[-1] != b"[DONE]":
            return None
        last = orjson.loads(events[-2])
        return assert_openai_error(last) if "error" in last else None

    def completed(self) -> bool:
        """Every event parses as JSON, the stream ends with [DONE] and carries no error."""
        events = self.events
        if not events or events[-1] != b"[DONE]":
            return False
        return all("error" not in orjson.loads(e) for e in events[:-1])


async def post_stream(
    session: aiohttp.ClientSession, url: str, body: Any, headers: dict[str, str] | None = None
) -> StreamResult:
    """POST and read the whole answer, noting whether the body was cut short."""
    data = body if isinstance(body, bytes) else orjson.dumps(body)
    hdrs = {"Content-Type": "application/json", **(headers or {})}
    async with session.post(url, data=data, headers=hdrs) as resp:
        chunks = []
        terminated = True
        try:
            async for chunk in resp.content.iter_any():
                chunks.append(chunk)
        except aiohttp.ClientPayloadError:
            terminated = False
        return StreamResult(resp.status, dict(resp.headers), b"".join(chunks), terminated)


def chat_body(stream: bool = False, content: str = "hi", **extra: Any) -> dict[str, Any]:
    return {
        "model": "fake-model",
        "messages": [{"role": "user", "content": content}],
        "stream": stream,
        **extra,
    }


# --- metrics ----------------------------------------------------------------------------------


async def metric_total(session: aiohttp.ClientSession, url: str, name: str, **labels: str) -> float:
    """The sum of every sample of ``name`` (matching ``labels``) at ``url``/metrics."""
    from prometheus_client.parser import text_string_to_metric_families

    async with session.get(f"{url}/metrics") as resp:
        text = await resp.text()
    total = 0.0
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == name and all(sample.labels.get(k) == v for k, v in labels.items()):
                total += sample.value
    return total


async def eventually(
    check: Callable[[], Awaitable[bool]], deadline: float = 10.0, what: str = "condition"
) -> None:
    """Re-check an out-of-process condition (a metric, a process) until it holds."""
    loop = asyncio.get_running_loop()
    end = loop.time() + deadline
    while not await check():
        assert loop.time() < end, f"{what} not reached within {deadline:g}s"
        await asyncio.sleep(0.02)


# --- configuration files -----------------------------------------------------------------------


def toml_value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return repr(value)
    if isinstance(value, str | Path):
        return json.dumps(str(value))
    if isinstance(value, list | tuple):
        return "[" + ", ".join(toml_value(v) for v in value) + "]"
    if isinstance(value, dict):
        return "{" + ", ".join(f"{k} = {toml_value(v)}" for k, v in value.items()) + "}"
    raise TypeError(f"cannot write {value!r} as TOML")


def config_text(backends: list[dict[str, Any]] = (), **top: Any) -> str:  # type: ignore[assignment]
    """A speclane TOML file: top-level keys (dict values become tables), then [[backends]]."""
    lines = [f"{k} = {toml_value(v)}" for k, v in top.items() if not isinstance(v, dict)]
    for key, table in top.items():
        if isinstance(table, dict):
            lines.append(f"[{key}]")
            lines += [f"{k} = {toml_value(v)}" for k, v in table.items()]
    for b in backends:
        lines.append("[[backends]]")
        lines += [f"{k} = {toml_value(v)}" for k, v in b.items()]
    return "\n".join(lines) + "\n"


def clean_env(**extra: str) -> dict[str, str]:
    """The environment without any SPECLANE_* variable of the developer's shell."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("SPECLANE_")}
    env["PYTHONUNBUFFERED"] = "1"
    env.update(extra)
    return env


# --- the router as a subprocess -----------------------------------------------------------------

SERVE = [sys.executable, "-m", "router", "serve"]
LISTENING = re.compile(r"listening on (http://\S+)")


@dataclass
class RouterProcess:
    proc: asyncio.subprocess.Process
    base_url: str  # .../v1
    stdout: list[str]
    stderr: list[str]
    _readers: list[asyncio.Task[None]]

    @property
    def url(self) -> str:
        return self.base_url.removesuffix("/v1")

    @property
    def port(self) -> int:
        return int(self.url.rsplit(":", 1)[1])

    @property
    def ps(self) -> psutil.Process:
        return psutil.Process(self.proc.pid)

    @classmethod
    async def start(
        cls, config: Path, *args: str, env: dict[str, str] | None = None, deadline: float = 90.0
    ) -> RouterProcess:
        proc = await asyncio.create_subprocess_exec(
            *SERVE,
            "--config",
            str(config),
            "--port",
            "0",
            *args,
            cwd=REPO,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
            env=env or clean_env(),
            start_new_session=True,
        )
        stdout: list[str] = []
        stderr: list[str] = []
        listening: asyncio.Future[str] = asyncio.get_running_loop().create_future()
        readers = [
            asyncio.create_task(_pump(proc.stdout, stdout, listening)),
            asyncio.create_task(_pump(proc.stderr, stderr, None)),
        ]
        exited = asyncio.ensure_future(proc.wait())
        readers.append(exited)  # type: ignore[arg-type]
        try:
            async with asyncio.timeout(deadline):
                await asyncio.wait({listening, exited}, return_when=asyncio.FIRST_COMPLETED)
            if not listening.done():
                await asyncio.wait(readers, timeout=2)
                raise AssertionError(
                    f"router exited with {proc.returncode} before listening:\n"
                    + "".join(stderr[-30:])
                )
        except BaseException:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            await proc.wait()
            raise
        return cls(proc, listening.result(), stdout, stderr, readers)

    async def exited(self, wait: float) -> int:
        """Wait (without signalling) for the router to exit; its exit code."""
        await asyncio.wait_for(self.proc.wait(), wait)
        await asyncio.wait(self._readers, timeout=5)
        return self.proc.returncode  # type: ignore[return-value]

    async def stop(self, sig: signal.Signals = signal.SIGTERM, wait: float = 30.0) -> int:
        """Signal the router and wait for its exit; SIGKILL the group past ``wait`` seconds."""
        if self.proc.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                self.proc.send_signal(sig)
            try:
                await asyncio.wait_for(self.proc.wait(), wait)
            except TimeoutError:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(self.proc.pid, signal.SIGKILL)
                await self.proc.wait()
                raise
        await asyncio.wait(self._readers, timeout=5)
        return self.proc.returncode  # type: ignore[return-value]


async def _pump(
    stream: asyncio.StreamReader | None, lines: list[str], listening: asyncio.Future[str] | None
) -> None:
    assert stream is not None
    async for raw in stream:
        line = raw.decode("utf-8", "replace")
        lines.append(line)
        if listening is not None and not listening.done() and (m := LISTENING.search(line)):
            listening.set_result(m.group(1))


async def run_serve(
    *args: str, env: dict[str, str] | None = None, wait: float = 60.0
) -> tuple[int, str, str]:
    """Run ``speclane serve`` to its exit (it is expected to refuse to start)."""
    proc = await asyncio.create_subprocess_exec(
        *SERVE,
        *args,
        cwd=REPO,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        env=env or clean_env(),
        start_new_session=True,
    )
    try:
        out, err = await asyncio.wait_for(proc.communicate(), wait)
    except TimeoutError:
        os.killpg(proc.pid, signal.SIGKILL)
        await proc.wait()
        raise AssertionError(f"speclane serve {args} did not exit within {wait}s") from None
    return proc.returncode or 0, out.decode(), err.decode()


# --- an in-process router on any address ---------------------------------------------------------


@dataclass
class Served:
    app: web.Application
    services: Services
    host: str
    port: int

    @property
    def url(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}"

    @property
    def base_url(self) -> str:
        return f"{self.url}/v1"


@contextlib.asynccontextmanager
async def serve_app(
    settings: Settings,
    host: str = "127.0.0.1",
    setup: Callable[[Wired], Any] | None = None,
) -> AsyncIterator[Served]:
    """``tests.conftest.run_router`` on a chosen bind address (non-loopback access tests)."""
    # As serve does: the bind address is in the settings (the Host rule allows it).
    wired = wire(settings.model_copy(update={"host": host}))
    app = wired.app
    if setup is not None:
        setup(wired)
    runner = web.AppRunner(
        app, handler_cancellation=True, access_log=None, shutdown_timeout=settings.shutdown_grace
    )
    await runner.setup()
    await web.TCPSite(runner, host, 0).start()
    try:
        yield Served(app, wired.services, host, runner.addresses[0][1])
    finally:
        await runner.cleanup()


def non_loopback_ipv4() -> str | None:
    """An address of this machine that is not loopback (None when there is none)."""
    for addrs in psutil.net_if_addrs().values():
        for a in addrs:
            if a.family == socket.AF_INET:
                ip = ipaddress.ip_address(a.address)
                if not ip.is_loopback and not ip.is_link_local:
                    return a.address
    return None


# --- a misbehaving upstream below HTTP -----------------------------------------------------------

MODELS_ANSWER = orjson.dumps({"object": "list", "data": [{"id": "fake-model", "object": "model"}]})


async def read_request(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> bytes | None:
    """One request off a scripted upstream's connection: its body, or None when it was the
    model list, answered here (the router asks for it on its own schedule)."""
    head = await reader.readuntil(b"\r\n\r\n")
    length = re.search(rb"(?i)content-length:\s*(\d+)", head)
    body = await reader.readexactly(int(length.group(1))) if length else b""
    if head.startswith(b"GET /v1/models"):
        writer.write(
            b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
            b"Content-Length: %d\r\n\r\n%s" % (len(MODELS_ANSWER), MODELS_ANSWER)
        )
        await writer.drain()
        return None
    return body


Script = Callable[[asyncio.StreamReader, asyncio.StreamWriter, bytes], Coroutine[Any, Any, None]]


class RawUpstream(LoopbackServer):
    """Answers ``GET /v1/models`` properly (so health checks pass) and runs ``script`` for
    every other request. Notes when the router closes a connection it had sent a request on:
    that is the upstream work being stopped."""

    def __init__(self, script: Script, name: str = "raw") -> None:
        self.script = script
        self.name = name
        self.requests = 0
        self.peer_closed = 0
        self.closed_event = asyncio.Event()

    async def start(self) -> None:
        await self.listen()

    async def stop(self) -> None:
        if self._server is not None:
            self._server.close()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._server.wait_closed(), 2)

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                body = await read_request(reader, writer)
                if body is None:
                    continue
                self.requests += 1
                await self.script(reader, writer, body)
                return
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()

    async def wait_peer_close(self, reader: asyncio.StreamReader) -> None:
        """Block until the router closes the connection; count it."""
        with contextlib.suppress(ConnectionError):
            while await reader.read(65536):
                pass
        self.peer_closed += 1
        self.closed_event.set()


# --- an event loop in a thread, for synchronous (hypothesis) tests ----------------------------


class LoopThread:
    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(
            target=self.loop.run_forever, daemon=True, name="reliability-loop"
        )

    def __enter__(self) -> LoopThread:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(10)
        self.loop.close()

    def run(self, coro: Coroutine[Any, Any, T], timeout: float = 120.0) -> T:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout)


# --- raw HTTP, synchronous: exactly the bytes we want on the wire -----------------------------


@dataclass
class RawResponse:
    status: int
    headers: list[tuple[str, str]]
    body: bytes
    head: bytes

    def header(self, name: str) -> str | None:
        return next((v for k, v in self.headers if k.lower() == name.lower()), None)


def raw_http(port: int, request: bytes, timeout: float = 20.0) -> RawResponse:
    """Send ``request`` verbatim (it should say ``Connection: close``); read the answer."""
    with socket.create_connection(("127.0.0.1", port), timeout=timeout) as sock:
        # No half-close after sending: aiohttp takes EOF from a client as its disconnection.
        with contextlib.suppress(ConnectionError):  # the server may answer before reading all
            sock.sendall(request)
        data = bytearray()
        deadline = time.monotonic() + timeout
        while True:
            try:
                chunk = sock.recv(65536)
            except ConnectionResetError:
                break
            if not chunk:
                break
            data += chunk
            assert time.monotonic() < deadline, "no end of answer"
    return parse_response(bytes(data))


def parse_response(data: bytes) -> RawResponse:
    head, sep, rest = data.partition(b"\r\n\r\n")
    assert sep, f"no complete HTTP answer: {data[:200]!r}"
    lines = head.split(b"\r\n")
    status = int(lines[0].split()[1])
    headers = []
    for line in lines[1:]:
        k, _, v = line.decode("latin-1").partition(":")
        headers.append((k.strip(), v.strip()))
    resp = RawResponse(status, headers, rest, head)
    if (resp.header("Transfer-Encoding") or "").lower() == "chunked":
        resp.body = dechunk(rest)
    elif (length := resp.header("Content-Length")) is not None:
        resp.body = rest[: int(length)]
    return resp


def dechunk(data: bytes) -> bytes:
    out = bytearray()
    while data:
        size_line, _, data = data.partition(b"\r\n")
        size = int(size_line.split(b";")[0] or b"0", 16)
        if size == 0:
            break
        out += data[:size]
        data = data[size + 2 :]
    return bytes(out)


def http_request(
    method: str, path: str, body: bytes = b"", headers: list[tuple[bytes, bytes]] | None = None
) -> bytes:
    lines = [
        f"{method} {path} HTTP/1.1".encode(),
        b"Host: 127.0.0.1",
        b"Connection: close",
        b"Content-Length: %d" % len(body),
    ]
    lines += [k + b": " + v for k, v in headers or []]
    return b"\r\n".join(lines) + b"\r\n\r\n" + body


async def read_stream(
    s: aiohttp.ClientSession,
    url: str,
    body: dict[str, Any],
    headers: dict[str, str],
    first: asyncio.Event,
) -> StreamResult:
    """POST a streaming request and read it whole; ``first`` is set at the first bytes (or
    at the end, if none came)."""
    async with s.post(url, json=body, headers=headers) as resp:
        data = bytearray()
        terminated = True
        try:
            async for piece in resp.content.iter_any():
                data += piece
                first.set()
        except aiohttp.ClientPayloadError:
            terminated = False
        first.set()
        return StreamResult(resp.status, dict(resp.headers), bytes(data), terminated)
