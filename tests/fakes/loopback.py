"""The common ground of the fake upstreams that speak raw HTTP/1.1: a TCP server on
127.0.0.1, port 0 (the system picks a free one), serving each connection with ``_serve``."""

from __future__ import annotations

import asyncio


class LoopbackServer:
    port = 0
    _server: asyncio.Server | None = None

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    async def listen(self) -> asyncio.Server:
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        self.port = self._server.sockets[0].getsockname()[1]
        return self._server

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        raise NotImplementedError
