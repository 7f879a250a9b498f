"""Start and stop the processes a benchmark measures (upstream, speclane, nginx)."""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
import shutil
import signal
import socket
import sys
import tempfile
from collections.abc import AsyncIterator, Sequence
from pathlib import Path
from typing import IO, Any, NamedTuple

import aiohttp

Spawned = tuple[asyncio.subprocess.Process, re.Match[str]]


class Served(NamedTuple):
    """A benchmarked server: its base URL and the id of the session it leads (its own
    process and any workers it starts), for CPU accounting and pinning."""

    url: str
    sid: int


async def spawn_until_line(argv: list[str], pattern: str, deadline: float = 60.0,
                           env: dict[str, str] | None = None,
                           stderr: int | IO[Any] = asyncio.subprocess.DEVNULL) -> Spawned:
    """Start a process and wait for a stdout line matching ``pattern``; kill it on failure."""
    proc = await asyncio.create_subprocess_exec(
        *argv, stdout=asyncio.subprocess.PIPE, stderr=stderr,
        env=env, start_new_session=True)
    assert proc.stdout is not None
    try:
        async with asyncio.timeout(deadline):
            while True:
                line = (await proc.stdout.readline()).decode()
                if not line:
                    code = await proc.wait()
                    raise RuntimeError(f"{argv[0]} exited with {code} before it was ready")
                if match := re.search(pattern, line):
                    return proc, match
    except BaseException:
        await stop(proc)
        raise


async def wait_http(url: str, proc: asyncio.subprocess.Process, deadline: float) -> None:
    """Ask ``url`` every half second until it answers 200: a server in another process has
    nothing else to await. RuntimeError when the process exits or ``deadline`` seconds pass."""
    loop = asyncio.get_running_loop()
    end = loop.time() + deadline
    async with aiohttp.ClientSession() as session:
        while True:
            if proc.returncode is not None:
                raise RuntimeError(f"the process exited with {proc.returncode} before {url} "
                                   "answered")
            if loop.time() > end:
                raise RuntimeError(f"{url} did not answer 200 within {deadline:g} s")
            with contextlib.suppress(aiohttp.ClientError):
                async with session.get(url) as resp:
                    if resp.status == 200:
                        return
            await asyncio.sleep(0.5)


async def stop(proc: asyncio.subprocess.Process, grace: float = 10.0) -> None:
    if proc.returncode is not None:
        return
    with contextlib.suppress(ProcessLookupError):
        proc.send_signal(signal.SIGTERM)
    try:
        await asyncio.wait_for(proc.wait(), grace)
    except TimeoutError:
        with contextlib.suppress(ProcessLookupError):
            proc.kill()
        await proc.wait()


async def stop_group(proc: asyncio.subprocess.Process, grace: float = 15.0) -> None:
    """SIGTERM, then after ``grace`` SIGKILL to the whole process group: a process started
    by ``spawn_until_line`` leads its own session, and its children (lane workers) in it
    must not outlive it."""
    if proc.returncode is None:
        with contextlib.suppress(ProcessLookupError):
            proc.send_signal(signal.SIGTERM)
        try:
            await asyncio.wait_for(proc.wait(), grace)
        except TimeoutError:
            pass
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGKILL)
    if proc.returncode is None:
        await proc.wait()


async def drain(stream: asyncio.StreamReader | None, sink: IO[bytes] | None) -> None:
    """Keep reading a child's stdout after its ready line, so a full pipe never blocks it."""
    if stream is None:
        return
    while chunk := await stream.read(65536):
        if sink is not None:
            sink.write(chunk)
            sink.flush()


@contextlib.asynccontextmanager
async def bench_upstream() -> AsyncIterator[Served]:
    proc, m = await spawn_until_line([sys.executable, "-m", "router.bench.upstream"],
                                     r"UPSTREAM_READY (\d+)")
    try:
        yield Served(f"http://127.0.0.1:{m.group(1)}/v1", proc.pid)
    finally:
        await stop(proc)


@contextlib.asynccontextmanager
async def speclane_router(upstream_base: str, prefix: Sequence[str] = (),
                          deadline: float = 60.0) -> AsyncIterator[Served]:
    """speclane without lanes, one backend: the upstream. ``prefix`` runs it under another
    program (``valgrind --tool=callgrind ...``)."""
    with tempfile.TemporaryDirectory(prefix="speclane-bench-") as tmp:
        config = Path(tmp) / "speclane.toml"
        (Path(tmp) / "policies").mkdir()
        config.write_text(
            f'policies_dir = "{tmp}/policies"\nlog_level = "warning"\n[lanes]\nenabled = false\n'
            f'[[backends]]\nname = "bench"\nkind = "openai"\nbase_url = "{upstream_base}"\n')
        env = {k: v for k, v in os.environ.items() if not k.startswith("SPECLANE_")}
        proc, m = await spawn_until_line(
            [*prefix, sys.executable, "-m", "router", "serve", "--config", str(config),
             "--port", "0"], r"listening on (http://\S+)", deadline=deadline, env=env)
        try:
            yield Served(m.group(1), proc.pid)
        finally:
            await stop(proc)


def nginx_binary() -> str | None:
    return shutil.which("nginx") or next(
        (p for p in ("/usr/sbin/nginx", "/usr/local/sbin/nginx") if Path(p).exists()), None)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


NGINX_CONF = """
worker_processes 1;
daemon off;
pid {tmp}/nginx.pid;
error_log {tmp}/error.log warn;
events {{ worker_connections 4096; }}
http {{
  access_log off;
  client_body_temp_path {tmp}/body; proxy_temp_path {tmp}/proxy;
  fastcgi_temp_path {tmp}/fcgi; uwsgi_temp_path {tmp}/uwsgi; scgi_temp_path {tmp}/scgi;
  upstream up {{ server {upstream}; keepalive 128; }}
  server {{
    listen 127.0.0.1:{port};
    location / {{
      proxy_pass http://up;
      proxy_http_version 1.1;
      proxy_set_header Connection "";
      proxy_buffering off;
    }}
  }}
}}
"""


@contextlib.asynccontextmanager
async def nginx_proxy(upstream_base: str) -> AsyncIterator[Served]:
    """nginx as a plain reverse proxy (1 worker, no buffering, upstream keepalive)."""
    binary = nginx_binary()
    if binary is None:
        raise RuntimeError("nginx is not installed")
    hostport = upstream_base.split("//", 1)[1].split("/", 1)[0]
    port = free_port()
    with tempfile.TemporaryDirectory(prefix="speclane-nginx-") as tmp:
        conf = Path(tmp) / "nginx.conf"
        conf.write_text(NGINX_CONF.format(tmp=tmp, upstream=hostport, port=port))
        proc = await asyncio.create_subprocess_exec(
            binary, "-c", str(conf), "-p", tmp, "-e", f"{tmp}/error.log",
            stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.DEVNULL,
            start_new_session=True)
        try:
            await _wait_port(port, proc)
            yield Served(f"http://127.0.0.1:{port}/v1", proc.pid)
        finally:
            await stop(proc)


async def _wait_port(port: int, proc: asyncio.subprocess.Process, deadline: float = 10) -> None:
    async with asyncio.timeout(deadline):
        while True:
            if proc.returncode is not None:
                raise RuntimeError(f"nginx exited with {proc.returncode}")
            try:
                _, writer = await asyncio.open_connection("127.0.0.1", port)
            except OSError:
                await asyncio.sleep(0.05)
                continue
            writer.close()
            return
