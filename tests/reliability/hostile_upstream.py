"""A keep-alive upstream that answers with exactly the bytes a test scripts, below HTTP.

Unlike ``harness.RawUpstream`` (one request per connection), it keeps reading requests
on a connection for as long as its script returns True, so tests can see whether the
router reuses a connection after a given answer, and counts connections and requests.
``GET /v1/models`` is answered properly so that health checks pass.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable

from tests.fakes.loopback import LoopbackServer
from tests.reliability.harness import read_request

# (writer, request body, index of the request on its connection) -> keep the connection?
Script = Callable[[asyncio.StreamWriter, bytes, int], Awaitable[bool]]


class HostileUpstream(LoopbackServer):
    def __init__(self, script: Script, name: str = "hostile") -> None:
        self.script = script
        self.name = name
        self.connections = 0
        self.requests = 0
        self.request_connections = 0  # connections that carried a request (not a health check)
        self.tasks: set[asyncio.Task[None]] = set()

    async def __aenter__(self) -> HostileUpstream:
        await self.listen()
        return self

    async def __aexit__(self, *exc: object) -> None:
        assert self._server is not None
        self._server.close()
        for task in list(self.tasks):
            task.cancel()
        await asyncio.gather(*self.tasks, return_exceptions=True)
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._server.wait_closed(), 2)

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self.tasks.add(task)
        self.connections += 1
        index = 0
        try:
            while True:
                body = await read_request(reader, writer)
                if body is None:
                    continue
                self.requests += 1
                index += 1
                if index == 1:
                    self.request_connections += 1
                if not await self.script(writer, body, index):
                    return
        except (
            asyncio.IncompleteReadError,
            asyncio.LimitOverrunError,
            ConnectionError,
            asyncio.CancelledError,
        ):
            pass
        finally:
            self.tasks.discard(task)
            writer.close()


def chunk(data: bytes) -> bytes:
    return b"%x\r\n%s\r\n" % (len(data), data)


def json_answer(body: bytes, extra: bytes = b"") -> bytes:
    return (
        b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
        + extra
        + b"Content-Length: %d\r\n\r\n" % len(body)
        + body
    )
