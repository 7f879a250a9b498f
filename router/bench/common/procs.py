"""Start and stop the processes a benchmark measures: the synthetic upstream, speclane (in
front of it, or with its two MLX lanes), nginx. ``own_router`` keeps speclane's defaults
except what the bench must control, including its policies (``POLICIES``): the forced
scenarios' client has the auto-disable off, so that "speculation on" stays on."""

from __future__ import annotations

import asyncio
import contextlib
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

Spawned = tuple[asyncio.subprocess.Process, re.Match[str]]
# The first start may prepare the default model (a ~93 MB wheel, converted locally).
START_DEADLINE = 1200.0
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


class Served(NamedTuple):
    """A benchmarked server: its base URL and the id of the session it leads (its own
    process and any workers it starts), for CPU accounting and pinning."""

    url: str
    sid: int


async def spawn_until_line(
    argv: list[str],
    pattern: str,
    deadline: float = 60.0,
    env: dict[str, str] | None = None,
    stderr: int | IO[Any] = asyncio.subprocess.DEVNULL,
) -> Spawned:
    """Start a process and wait for a stdout line matching ``pattern``; kill it on failure."""
    proc = await asyncio.create_subprocess_exec(
        *argv, stdout=asyncio.subprocess.PIPE, stderr=stderr, env=env, start_new_session=True
    )
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
                raise RuntimeError(
                    f"the process exited with {proc.returncode} before {url} answered"
                )
            if loop.time() > end:
                raise RuntimeError(f"{url} did not answer 200 within {deadline:g} s")
            with contextlib.suppress(aiohttp.ClientError):
                async with session.get(url) as resp:
                    if resp.status == 200:
                        return
            await asyncio.sleep(0.5)


async def stop(proc: asyncio.subprocess.Process, grace: float = 10.0, group: bool = False) -> None:
    """SIGTERM, then SIGKILL after ``grace`` seconds. ``group``: the SIGKILL goes to the
    whole process group whatever happened: a process started here leads its own session,
    and its children (lane workers) must not outlive it."""
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
    if stream is None:
        return
    while chunk := await stream.read(65536):
        if sink is not None:
            sink.write(chunk)
            sink.flush()


@contextlib.asynccontextmanager
async def bench_upstream() -> AsyncIterator[Served]:
    proc, m = await spawn_until_line(
        [sys.executable, "-m", "router.bench.common.upstream"], r"UPSTREAM_READY (\d+)"
    )
    try:
        yield Served(f"http://127.0.0.1:{m.group(1)}/v1", proc.pid)
    finally:
        await stop(proc)


@contextlib.asynccontextmanager
async def speclane_router(
    upstream_base: str, prefix: Sequence[str] = (), deadline: float = 60.0
) -> AsyncIterator[Served]:
    """speclane without lanes, one backend: the upstream. ``prefix`` runs it under another
    program (``valgrind --tool=callgrind ...``)."""
    config = (
        'log_level = "warning"\n[lanes]\nenabled = false\n[[backends]]\nname = "bench"\n'
        f'kind = "openai"\nbase_url = "{upstream_base}"\n'
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith("SPECLANE_")}
    async with _router(config, {}, env, prefix, deadline) as served:
        yield served


@contextlib.asynccontextmanager
async def own_router(lanes: LaneOptions, log_path: Path) -> AsyncIterator[str]:
    """A running router with both lanes; yields its base URL (``.../v1``). Its log is
    truncated per run: it sits next to the results it explains, which each run rewrites."""
    with log_path.open("wb") as log:
        async with _router(
            lanes_config(lanes), POLICIES, router_env(), (), START_DEADLINE, log
        ) as served:
            yield served.url


@contextlib.asynccontextmanager
async def _router(
    config: str,
    policies: dict[str, str],
    env: dict[str, str],
    prefix: Sequence[str],
    deadline: float,
    log: IO[bytes] | None = None,
) -> AsyncIterator[Served]:
    """speclane serving ``config`` from a temporary directory with these policy files; its
    output goes to ``log`` (with its lane workers, which it takes down with it)."""
    with tempfile.TemporaryDirectory(prefix="speclane-bench-") as tmp:
        config_path, policies_dir = Path(tmp) / "speclane.toml", Path(tmp) / "policies"
        write_policies(policies_dir, policies)
        config_path.write_text(
            f"policies_dir = {json.dumps(str(policies_dir))}\n{config}", encoding="utf-8"
        )
        argv = [*prefix, sys.executable, "-m", "router", "serve", "--config", str(config_path)]
        proc, m = await spawn_until_line(
            [*argv, "--port", "0"],
            r"speclane listening on (http://\S+)",
            deadline=deadline,
            env=env,
            stderr=log or asyncio.subprocess.DEVNULL,
        )
        drainer = asyncio.create_task(drain(proc.stdout, log))
        try:
            yield Served(m.group(1), proc.pid)
        finally:
            await stop(proc, 15.0 if log else 10.0, group=log is not None)
            drainer.cancel()


async def _spawn(
    argv: list[str], out: int | IO[Any], env: dict[str, str] | None = None
) -> asyncio.subprocess.Process:
    """A process in its own session (so that a group kill takes its children too)."""
    return await asyncio.create_subprocess_exec(
        *argv, stdout=out, stderr=out, env=env, start_new_session=True
    )


def nginx_binary() -> str | None:
    return shutil.which("nginx") or next(
        (p for p in ("/usr/sbin/nginx", "/usr/local/sbin/nginx") if Path(p).exists()), None
    )


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
        argv = [binary, "-c", str(conf), "-p", tmp, "-e", f"{tmp}/error.log"]
        proc = await _spawn(argv, asyncio.subprocess.DEVNULL)
        try:
            await wait_http(f"http://127.0.0.1:{port}/v1/models", proc, 10.0)
            yield Served(f"http://127.0.0.1:{port}/v1", proc.pid)
        finally:
            await stop(proc)


@dataclass(frozen=True)
class LaneOptions:
    model: str | None = None
    draft_model: str | None = None
    num_draft_tokens: int | None = None
    max_batch_size: int = 8
    layout: str | None = None  # [lanes] layout; None: the router's default
    shared_threads: int | None = None  # [lanes] shared_threads; None: the router's default


def write_policies(directory: Path, policies: dict[str, str] = POLICIES) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    for name, text in policies.items():
        (directory / name).write_text(text, encoding="utf-8")
    return directory


def lanes_config(lanes: LaneOptions) -> str:
    q = json.dumps  # a JSON string is a valid TOML basic string
    lines = ['log_level = "info"', "shutdown_grace = 2", "[lanes]"]
    lines.append(f"max_batch_size = {lanes.max_batch_size}")
    for key in ("model", "draft_model", "num_draft_tokens", "layout", "shared_threads"):
        if (value := getattr(lanes, key)) is not None and value != "":
            lines.append(f"{key} = {q(value)}")  # json.dumps of an int is the int
    return "\n".join(lines) + "\n"


def router_env() -> dict[str, str]:
    """This environment without ``SPECLANE_*`` settings overrides (the temporary file must
    be what runs); process-level switches such as SPECLANE_HOME stay."""
    from router.config.settings import Settings

    fields = {name.lower() for name in Settings.model_fields}
    return {
        key: value
        for key, value in os.environ.items()
        if not (
            key.startswith("SPECLANE_")
            and key[len("SPECLANE_") :].lower().split("__", 1)[0] in fields
        )
    }


MLX_START_DEADLINE = 600.0


@contextlib.asynccontextmanager
async def mlx_lm_server(
    model_dir: Path, log_path: Path, extra: Sequence[str] = ()
) -> AsyncIterator[Served]:
    """``python -m mlx_lm.server --model DIR [extra]`` on a free port, in its own session;
    yields its ``/v1`` URL and its pid (the session's leader)."""
    from router.lanes.blas import preload_env

    port = free_port()
    env = {**os.environ, **preload_env()}  # the same BLAS as the lanes
    argv = [sys.executable, "-m", "mlx_lm.server", "--model", str(model_dir), *extra]
    with log_path.open("wb") as log:
        proc = await _spawn([*argv, "--host", "127.0.0.1", "--port", str(port)], log, env)
        try:
            await wait_http(f"http://127.0.0.1:{port}/v1/models", proc, MLX_START_DEADLINE)
            yield Served(f"http://127.0.0.1:{port}/v1", proc.pid)
        finally:
            await stop(proc, 15.0, group=True)
