"""The aiohttp assumptions of router.proxy.connections: the private names it relies on
exist in the installed aiohttp, that version is one pyproject.toml allows, and the guard
they implement works (a request head trickled in past aiohttp's idle timeout still gets
its 408, which only extending aiohttp's private idle deadline makes happen)."""

from __future__ import annotations

import asyncio
import tomllib
from pathlib import Path

import aiohttp
from aiohttp import web
from aiohttp.web_protocol import RequestHandler
from aiohttp.web_server import Server
from packaging.requirements import Requirement

from router.config.settings import ClientLimits
from router.proxy.connections import (
    AIOHTTP_PRIVATE_NAMES,
    GuardedHandler,
    GuardedRunner,
    GuardedServer,
)

PYPROJECT = Path(__file__).resolve().parents[2] / "pyproject.toml"


def test_the_installed_aiohttp_is_a_tested_version() -> None:
    deps = tomllib.loads(PYPROJECT.read_text())["project"]["dependencies"]
    (req,) = [Requirement(d) for d in deps if Requirement(d).name == "aiohttp"]
    assert req.specifier.contains(aiohttp.__version__), (
        f"aiohttp {aiohttp.__version__} is outside {req.specifier}: run this file and "
        "tests/reliability/test_client_connections.py, then widen the range"
    )
    assert any(s.operator == "<" for s in req.specifier)  # an upper bound: no silent release


async def _serve(limits: ClientLimits) -> tuple[GuardedRunner, int]:
    async def hello(request: web.Request) -> web.Response:
        return web.Response(text="hello")

    app = web.Application()
    app.router.add_get("/", hello)
    runner = GuardedRunner(app, limits, cap=8)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    return runner, runner.addresses[0][1]


async def test_every_private_name_relied_on_exists() -> None:
    runner, _ = await _serve(ClientLimits(keepalive_timeout=7.0))
    try:
        server = runner.server
        assert isinstance(server, GuardedServer)
        handler = server()
        assert isinstance(handler, GuardedHandler)
        instances = {RequestHandler: handler, Server: server, web.AppRunner: runner}
        missing = [
            f"{cls.__name__}.{name}"
            for cls, names in AIOHTTP_PRIVATE_NAMES.items()
            for name in names
            if not hasattr(instances[cls], name)
        ]
        assert not missing, f"aiohttp {aiohttp.__version__} no longer has {missing}"
        assert handler.keepalive_timeout == 7.0  # built with the base server's arguments
    finally:
        await runner.cleanup()


async def test_a_slow_head_gets_its_408_after_the_idle_timeout() -> None:
    """The idle timer (0.3 s) would close the connection silently while the head is still
    arriving; the head deadline (1 s) answers 408 instead."""
    runner, port = await _serve(ClientLimits(keepalive_timeout=0.3, head_timeout=1.0))
    try:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(b"GET / HTTP/1.1\r\nHost: x\r\n")  # a head never finished
        answer = await asyncio.wait_for(reader.read(), 10)
        writer.close()
        assert answer.startswith(b"HTTP/1.1 408"), answer
    finally:
        await runner.cleanup()
