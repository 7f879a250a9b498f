"""A loopback upstream that replays bytes captured from real servers, framed on purpose.

A raw asyncio server (not aiohttp), so that how the bytes reach the wire is under the test's
control: a stream's body goes out chunked, one HTTP chunk per SSE event, each in its own
write; the final event (``data: [DONE]``, or the last event when the capture has none) is
written alone, and the end of the body (the zero-size chunk) follows ``tail_gap`` seconds
later in a separate write. That gap is what llama-cpp-python (0.1-0.2 ms) and vllm-mlx put
between ``[DONE]`` and the end of their bodies, the moment a client that closes on
``[DONE]`` (the OpenAI SDK) lands in.

Fixtures are the files of ``tests/fixtures/real-backends`` (see its README): ``*.http`` are
``curl -i`` captures (status line, headers, body), ``*.sse`` / ``*.json`` / ``*.txt`` bodies.
"""

from __future__ import annotations

import asyncio
import contextlib
from dataclasses import dataclass
from pathlib import Path

from tests.fakes.loopback import LoopbackServer

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures" / "real-backends"


@dataclass(frozen=True)
class Capture:
    status: int
    content_type: str
    body: bytes


def load(name: str) -> Capture:
    """One fixture file as status, content type and body (bytes unchanged)."""
    raw = (FIXTURES / name).read_bytes()
    if not name.endswith(".http"):
        ctype = {".sse": "text/event-stream", ".json": "application/json"}.get(
            Path(name).suffix, "text/plain; version=0.0.4"
        )
        return Capture(200, ctype, raw)
    head, sep, body = raw.partition(b"\r\n\r\n")
    assert sep, f"{name}: no end of headers"
    lines = head.decode("latin-1").split("\r\n")
    status = int(lines[0].split()[1])
    ctype = "application/octet-stream"
    for line in lines[1:]:
        key, _, value = line.partition(":")
        if key.strip().lower() == "content-type":
            ctype = value.strip()
    return Capture(status, ctype, body)


def sse_events(body: bytes) -> list[bytes]:
    """The body split after each event's blank line (each piece keeps its own ending)."""
    pieces, start = [], 0
    while (end := body.find(b"\n\n", start)) >= 0:
        pieces.append(body[start : end + 2])
        start = end + 2
    if start < len(body):
        pieces.append(body[start:])
    return pieces


class ReplayUpstream(LoopbackServer):
    """Answers every POST with ``post`` (a stream goes out event by event, see the module
    doc) and each GET path in ``gets`` with its capture. Keeps connections alive."""

    def __init__(
        self,
        post: Capture,
        *,
        gets: dict[str, Capture] | None = None,
        tail_gap: float = 0.0002,
        endless_tail: bytes | None = None,
    ) -> None:
        self.post = post
        # instead of the end of body: these bytes, again and again, until the reader leaves
        self.endless_tail = endless_tail
        self.gets = gets or {}
        self.tail_gap = tail_gap
        self.answered = 0  # bodies sent to their end
        self.writing = 0  # answers being written now
        self.post_connections = 0  # connections that carried a POST (reused: counted once)
        self._conns: set[asyncio.StreamWriter] = set()

    async def start(self) -> None:
        await self.listen()

    async def stop(self) -> None:
        if self._server is not None:
            self._server.close()
            for w in list(self._conns):
                w.close()
            await self._server.wait_closed()

    async def __aenter__(self) -> ReplayUpstream:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self._conns.add(writer)
        posted = False
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                lines = head.decode("latin-1").split("\r\n")
                method, path = lines[0].split()[:2]
                length = 0
                for line in lines[1:]:
                    key, _, value = line.partition(":")
                    if key.strip().lower() == "content-length":
                        length = int(value)
                if length:
                    await reader.readexactly(length)
                if method == "POST":
                    self.post_connections += 0 if posted else 1
                    posted = True
                    await self._answer(writer, self.post)
                else:
                    cap = self.gets.get(path.split("?")[0])
                    await self._answer(writer, cap or Capture(404, "text/plain", b"not found"))
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            self._conns.discard(writer)
            writer.close()
            with contextlib.suppress(ConnectionError):
                await writer.wait_closed()

    async def _answer(self, writer: asyncio.StreamWriter, cap: Capture) -> None:
        self.writing += 1
        try:
            await self._write_answer(writer, cap)
        finally:
            self.writing -= 1

    async def _write_answer(self, writer: asyncio.StreamWriter, cap: Capture) -> None:
        status_line = f"HTTP/1.1 {cap.status} X\r\nContent-Type: {cap.content_type}\r\n"
        if "text/event-stream" not in cap.content_type:
            writer.write(
                f"{status_line}Content-Length: {len(cap.body)}\r\n\r\n".encode() + cap.body
            )
            await writer.drain()
            self.answered += 1
            return
        writer.write(f"{status_line}Transfer-Encoding: chunked\r\n\r\n".encode())
        for event in sse_events(cap.body):
            writer.write(b"%x\r\n%s\r\n" % (len(event), event))
            await writer.drain()
            await asyncio.sleep(0)  # one write per event, as a server that flushes each
        await asyncio.sleep(self.tail_gap)
        while self.endless_tail is not None:
            writer.write(b"%x\r\n%s\r\n" % (len(self.endless_tail), self.endless_tail))
            await writer.drain()
            await asyncio.sleep(0.01)
        writer.write(b"0\r\n\r\n")
        await writer.drain()
        self.answered += 1
