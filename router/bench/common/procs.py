"""Start and stop the processes a benchmark measures (the synthetic upstream, speclane in front
of it or with its lanes, nginx, ``mlx_lm.server``), each leading a session of its own so that
CPU accounting, pinning and a group kill take its workers too. The bench's policies keep
"speculation on" on: the forced scenarios' client has the auto-disable off."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import os
import re
import shutil
import signal
import socket
import sys
import tempfile
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any, NamedTuple

import aiohttp

from router.bench.common import BENCH_CLIENT

START_DEADLINE = 1200.0  # the first start may prepare the default model (download, convert)
POLICIES = {
    "default.toml": (
        "# speclane bench: the permissive default (the `auto` scenario).\n"
        'client = "default"\n'
        "allow_lane_override = true\n"
    ),
    f"{BENCH_CLIENT}.toml": (
        "# speclane bench: the forced scenarios. Speculation stays as the lane header asks.\n"
        f'client = "{BENCH_CLIENT}"\n'
        "allow_lane_override = true\n"
        "[match]\n"
        f'client_header = ["{BENCH_CLIENT}"]\n'
        "[spec]\n"
        "enabled = false\n"
    ),
}
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


class Served(NamedTuple):
    """A benchmarked server: its base URL and its session id (its pid)."""

    url: str
    sid: int


@dataclass(frozen=True)
class LaneOptions:
    model: str | None = None
    draft_model: str | None = None
    num_draft_tokens: int | None = None
    max_batch_size: int = 8
    layout: str | None = None  # [lanes] layout; None: the router's default
    shared_threads: int | None = None  # [lanes] shared_threads; None: the router's default
    # [lanes] prompt_cache_dir; None: a fresh directory per start (own_router)
    prompt_cache_dir: str | None = None
    unpinned: bool = False  # the start-up model may be unloaded (an entry of its name says so)


async def spawn_until_line(
    argv: list[str],
    pattern: str,
    deadline: float = 60.0,
    env: dict[str, str] | None = None,
    stderr: int | IO[Any] = asyncio.subprocess.DEVNULL,
) -> tuple[asyncio.subprocess.Process, re.Match[str]]:
    """Start a process and wait for a stdout line matching ``pattern``; kill it on failure."""
    proc = await asyncio.create_subprocess_exec(
        *argv, stdout=asyncio.subprocess.PIPE, stderr=stderr, env=env, start_new_session=True
    )
    assert proc.stdout is not None
    try:
        async with asyncio.timeout(deadline):
            while line := (await proc.stdout.readline()).decode():
                if match := re.search(pattern, line):
                    return proc, match
            raise RuntimeError(f"{argv[0]} exited with {await proc.wait()} before it was ready")
    except BaseException:
        await stop(proc)
        raise


async def wait_http(url: str, proc: asyncio.subprocess.Process, deadline: float) -> None:
    """Ask ``url`` every half second until it answers 200 (another process's server has
    nothing else to await); RuntimeError when the process exits or ``deadline`` passes."""
    end = asyncio.get_running_loop().time() + deadline
    async with aiohttp.ClientSession() as session:
        while proc.returncode is None and asyncio.get_running_loop().time() <= end:
            with contextlib.suppress(aiohttp.ClientError):
                async with session.get(url) as resp:
                    if resp.status == 200:
                        return
            await asyncio.sleep(0.5)
    if proc.returncode is not None:
        raise RuntimeError(f"the process exited with {proc.returncode} before {url} answered")
    raise RuntimeError(f"{url} did not answer 200 within {deadline:g} s")


async def stop(proc: asyncio.subprocess.Process, grace: float = 10.0, group: bool = False) -> None:
    """SIGTERM, then SIGKILL after ``grace`` seconds; ``group``: the SIGKILL goes to the whole
    process group whatever happened, so that its children (lane workers) never outlive it."""
    if proc.returncode is None:
        with contextlib.suppress(ProcessLookupError):
            proc.send_signal(signal.SIGTERM)
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(proc.wait(), grace)
    with contextlib.suppress(ProcessLookupError, PermissionError):
        if group:
            os.killpg(proc.pid, signal.SIGKILL)
        elif proc.returncode is None:
            proc.kill()
    if proc.returncode is None:
        await proc.wait()


async def drain(stream: asyncio.StreamReader | None, sink: IO[bytes] | None) -> None:
    """Keep reading a child's stdout after its ready line, so a full pipe never blocks it."""
    while stream is not None and (chunk := await stream.read(65536)):
        if sink is not None:
            sink.write(chunk)
            sink.flush()


@contextlib.asynccontextmanager
async def bench_upstream() -> AsyncIterator[Served]:
    argv = [sys.executable, "-m", "router.bench.common.upstream"]
    proc, m = await spawn_until_line(argv, r"UPSTREAM_READY (\d+)")
    try:
        yield Served(f"http://127.0.0.1:{m.group(1)}/v1", proc.pid)
    finally:
        await stop(proc)


@contextlib.asynccontextmanager
async def speclane_router(
    upstream_base: str, prefix: Sequence[str] = (), deadline: float = 60.0
) -> AsyncIterator[Served]:
    """speclane without lanes, its one backend the upstream; ``prefix`` runs it under another
    program (``valgrind --tool=callgrind ...``)."""
    config = (
        'log_level = "warning"\n[lanes]\nenabled = false\n[[backends]]\nname = "bench"\n'
        f'kind = "openai"\nbase_url = "{upstream_base}"\n'
    )
    async with _router(config, {}, prefix, deadline) as served:
        yield served


@contextlib.asynccontextmanager
async def own_router(
    lanes: LaneOptions, log_path: Path, policies: dict[str, str] = POLICIES
) -> AsyncIterator[str]:
    """speclane with both lanes; yields its base URL. Its log (with its workers') sits next to
    the results it explains, truncated per run as they are rewritten. Without a
    ``prompt_cache_dir`` its disk tier is a fresh directory: a benchmark starts as cold as the
    peers it is compared with, whatever an earlier run left in the user's own."""
    with log_path.open("wb") as log, tempfile.TemporaryDirectory(prefix="speclane-cache-") as tmp:
        if lanes.prompt_cache_dir is None:
            lanes = dataclasses.replace(lanes, prompt_cache_dir=tmp)
        config = lanes_config(lanes)
        async with _router(config, policies, (), START_DEADLINE, log) as served:
            yield served.url


@contextlib.asynccontextmanager
async def _router(
    config: str,
    policies: dict[str, str],
    prefix: Sequence[str],
    deadline: float,
    log: IO[bytes] | None = None,
) -> AsyncIterator[Served]:
    """``speclane serve`` on ``config`` and these policy files, from a temporary directory,
    without this environment's settings overrides."""
    with tempfile.TemporaryDirectory(prefix="speclane-bench-") as tmp:
        policies_dir = write_policies(Path(tmp) / "policies", policies)
        config_path = Path(tmp) / "speclane.toml"
        config_path.write_text(f"policies_dir = {json.dumps(str(policies_dir))}\n{config}")
        argv = [*prefix, sys.executable, "-m", "router", "serve", "--config", str(config_path)]
        ready, stderr = r"speclane listening on (http://\S+)", log or asyncio.subprocess.DEVNULL
        argv += ["--port", "0"]
        proc, m = await spawn_until_line(argv, ready, deadline, router_env(), stderr)
        drainer = asyncio.create_task(drain(proc.stdout, log))
        try:
            yield Served(m.group(1), proc.pid)
        finally:
            await stop(proc, 15.0 if log else 10.0, group=log is not None)
            drainer.cancel()


@contextlib.asynccontextmanager
async def _http_server(
    argv: list[str], port: int, deadline: float, log: int | IO[Any], env: dict[str, str] | None
) -> AsyncIterator[Served]:
    """A server that prints no ready line: started in its own session, ready when its
    ``/v1/models`` answers, stopped with its whole group."""
    proc = await asyncio.create_subprocess_exec(
        *argv, stdout=log, stderr=log, env=env, start_new_session=True
    )
    try:
        await wait_http(f"http://127.0.0.1:{port}/v1/models", proc, deadline)
        yield Served(f"http://127.0.0.1:{port}/v1", proc.pid)
    finally:
        await stop(proc, 15.0, group=True)


def nginx_binary() -> str | None:
    places = ("/usr/sbin/nginx", "/usr/local/sbin/nginx")
    return shutil.which("nginx") or next((p for p in places if Path(p).exists()), None)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextlib.asynccontextmanager
async def nginx_proxy(upstream_base: str) -> AsyncIterator[Served]:
    """nginx as a plain reverse proxy (1 worker, no buffering, upstream keepalive)."""
    if (binary := nginx_binary()) is None:
        raise RuntimeError("nginx is not installed")
    hostport, port = upstream_base.split("//", 1)[1].split("/", 1)[0], free_port()
    with tempfile.TemporaryDirectory(prefix="speclane-nginx-") as tmp:
        conf = Path(tmp) / "nginx.conf"
        conf.write_text(NGINX_CONF.format(tmp=tmp, upstream=hostport, port=port))
        argv = [binary, "-c", str(conf), "-p", tmp, "-e", f"{tmp}/error.log"]
        async with _http_server(argv, port, 10.0, asyncio.subprocess.DEVNULL, None) as served:
            yield served


@contextlib.asynccontextmanager
async def mlx_lm_server(
    model_dir: Path,
    log_path: Path,
    extra: Sequence[str] = (),
    *,
    launch: Sequence[str] = (),
    start_seconds: float = 600.0,
) -> AsyncIterator[Served]:
    """``[launch] python -m mlx_lm.server --model DIR [extra]`` on a free port, with the
    lanes' BLAS (``launch``: e.g. ``mlx.launch ... --``, for a distributed group)."""
    from router.lanes.blas import preload_env

    port, env = free_port(), {**os.environ, **preload_env()}
    argv = [*launch, sys.executable, "-m", "mlx_lm.server", "--model", str(model_dir), *extra]
    with log_path.open("wb") as log:
        argv += ["--host", "127.0.0.1", "--port", str(port)]
        async with _http_server(argv, port, start_seconds, log, env) as served:
            yield served


def write_policies(directory: Path, policies: dict[str, str] = POLICIES) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    for name, text in policies.items():
        (directory / name).write_text(text, encoding="utf-8")
    return directory


def lanes_config(lanes: LaneOptions) -> str:
    lines = ['log_level = "info"', "shutdown_grace = 2", "[lanes]"]
    lines.append(f"max_batch_size = {lanes.max_batch_size}")
    keys = ("model", "draft_model", "num_draft_tokens", "layout", "shared_threads")
    for key in (*keys, "prompt_cache_dir"):
        if (value := getattr(lanes, key)) is not None and value != "":
            lines.append(f"{key} = {json.dumps(value)}")  # JSON strings and ints are TOML
    if lanes.unpinned and lanes.model:
        name, path = json.dumps(Path(lanes.model).name), json.dumps(lanes.model)
        lines += ["[[lanes.models]]", f"name = {name}", f"path = {path}", "pinned = false"]
    return "\n".join(lines) + "\n"


def router_env() -> dict[str, str]:
    """This environment without ``SPECLANE_*`` settings overrides (the temporary file must be
    what runs); process-level switches such as SPECLANE_HOME stay."""
    from router.config.settings import Settings

    fields = {name.lower() for name in Settings.model_fields}

    def setting(key: str) -> bool:
        name = key.removeprefix("SPECLANE_")
        return name != key and name.lower().split("__", 1)[0] in fields

    return {key: value for key, value in os.environ.items() if not setting(key)}
