"""``speclane bench cold``: the measurements, round by round (what each one is: the package)."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import IO, Any

import aiohttp

from router.bench.cold import plan
from router.bench.cold.plan import COLD, MLX_LM_MODEL, SPECLANE, Mode, body
from router.bench.cold.report import summary
from router.bench.common import environment, procs
from router.bench.common.stream import Reply, stream
from router.config.names import OVERHEAD_HEADER

REQUEST_TIMEOUT = 900.0  # a first request may wait for a whole model load
TIMEOUT = aiohttp.ClientTimeout(total=REQUEST_TIMEOUT)
LISTENING = r"speclane listening on (http://\S+)"
RETRY_EVERY = 0.02  # seconds between tries while mlx_lm.server's port is not open yet


commit = environment.commit  # the checked-out commit (where the results come from)


def prime(model_dir: Path) -> None:
    """Read the model's files once, so that neither side's first round is the one that
    pays for the disk: both then load from the page cache."""
    for path in sorted(p for p in model_dir.iterdir() if p.is_file()):
        with path.open("rb") as f:
            while f.read(1 << 24):
                pass


async def first_token(
    session: aiohttp.ClientSession,
    url: str,
    payload: dict[str, Any],
    started: float,
    proc: asyncio.subprocess.Process | None = None,
) -> tuple[Reply, float | None]:
    """The reply, and the seconds from ``started`` (``perf_counter``) to its first token.
    With ``proc``: retried until the server's port takes it (the process still alive)."""
    while True:
        reply = await stream(session, f"{url}/chat/completions", payload, {}, Reply())
        refused = reply.status is None and reply.error and "Connect" in reply.error
        alive = proc is not None and proc.returncode is None
        if not (refused and alive and time.perf_counter() - started <= REQUEST_TIMEOUT):
            break
        await asyncio.sleep(RETRY_EVERY)
    return reply, reply.token_times[0] - started if reply.token_times else None


async def warm(
    session: aiohttp.ClientSession, url: str, model: str, args: argparse.Namespace
) -> dict[str, Any]:
    ttft, overhead, errors = [], [], []
    for i in range(args.warm):
        payload = body(model, 10 + i, args.max_tokens)
        reply = await stream(session, f"{url}/chat/completions", payload, {}, Reply())
        if reply.error or reply.ttft is None:
            errors.append(reply.error or "no token")
            continue
        ttft.append(reply.ttft)
        if value := reply.headers.get(OVERHEAD_HEADER):
            with contextlib.suppress(ValueError):
                overhead.append(float(value))
    return {"warm_ttft_s": ttft, "overhead_ms": overhead, "errors": errors}


def write_config(root: Path, mode: Mode, model_dir: Path, layout: str) -> Path:
    """The router's configuration and policies in ``root``; in on-demand mode, its models
    folder too (the model under two names)."""
    models_dir = root / "models" if mode == "on-demand" else None
    if models_dir is not None:
        files = [p.name for p in model_dir.iterdir() if p.is_file()]
        for link, target in plan.model_links(model_dir, files, models_dir):
            link.parent.mkdir(parents=True, exist_ok=True)
            link.symlink_to(target)
    policies = procs.write_policies(root / "policies")
    text = plan.speclane_config(mode, model_dir, policies, models_dir, layout)
    (root / "speclane.toml").write_text(text, encoding="utf-8")
    return root / "speclane.toml"


async def speclane_round(
    mode: Mode, model_dir: Path, args: argparse.Namespace, log: IO[bytes]
) -> dict[str, Any]:
    """``speclane serve`` on a temporary configuration, its start-up and first requests."""
    out: dict[str, Any] = {"mode": mode, "errors": []}
    model = plan.served_name(mode, model_dir)
    with tempfile.TemporaryDirectory(prefix="speclane-cold-") as tmp:
        config = write_config(Path(tmp), mode, model_dir, args.layout)
        argv = [sys.executable, "-m", "router", "serve", "--config", str(config), "--port", "0"]
        started = time.perf_counter()
        proc, m = await procs.spawn_until_line(
            argv, LISTENING, procs.START_DEADLINE, procs.router_env(), log
        )
        out["startup_s"], url = time.perf_counter() - started, m.group(1)
        drainer = asyncio.create_task(procs.drain(proc.stdout, log))
        try:
            async with aiohttp.ClientSession(timeout=TIMEOUT) as s:
                first = body(model, 0, args.max_tokens)
                reply, out["startup_first_token_s"] = await first_token(s, url, first, started)
                replies = [reply]
                if mode == "on-demand":
                    sent = time.perf_counter()
                    cold = body(COLD, 1, args.max_tokens)
                    reply, out["on_demand_first_token_s"] = await first_token(s, url, cold, sent)
                    replies.append(reply)
                figures = await warm(s, url, model, args)
                lanes = await environment.lanes_info(s, url.removesuffix("/v1"))
        finally:
            await procs.stop(proc, 15.0, group=True)
            drainer.cancel()
    out["errors"] = [r.error for r in replies if r.error] + figures.pop("errors")
    return {**out, "lanes": lanes, **figures}


async def mlx_round(model_dir: Path, args: argparse.Namespace, log: IO[bytes]) -> dict[str, Any]:
    """Started by hand, not with ``procs.mlx_lm_server``: the first request goes out as soon
    as the port takes it, not after a health poll."""
    from router.lanes.blas import preload_env

    port = procs.free_port()
    url = f"http://127.0.0.1:{port}/v1"
    argv = [sys.executable, "-m", "mlx_lm.server", "--model", str(model_dir)]
    argv += ["--host", "127.0.0.1", "--port", str(port)]
    started = time.perf_counter()
    proc = await asyncio.create_subprocess_exec(
        *argv,
        stdout=log,
        stderr=log,
        env={**os.environ, **preload_env()},  # the same BLAS as the lanes
        start_new_session=True,
    )
    try:
        async with aiohttp.ClientSession(timeout=TIMEOUT) as s:
            first = body(MLX_LM_MODEL, 0, args.max_tokens)
            reply, first_token_s = await first_token(s, url, first, started, proc)
            figures = await warm(s, url, MLX_LM_MODEL, args)
    finally:
        await procs.stop(proc, 15.0, group=True)
    errors = ([reply.error] if reply.error else []) + figures.pop("errors")
    return {"errors": errors, "first_token_s": first_token_s, **figures}


async def run(args: argparse.Namespace) -> dict[str, Any]:
    from router.lanes.modelprep import ensure_default_models

    model_dir = Path(args.model) if args.model else ensure_default_models(quiet=True)[0]
    mode: Mode = "on-demand" if args.mode == "auto" else args.mode
    args.out.parent.mkdir(parents=True, exist_ok=True)
    prime(model_dir)
    load_before = environment.load_average()
    rounds = []
    ours, theirs = (args.out.with_suffix(f".{side}.log") for side in ("speclane", "mlx_lm_server"))
    with ours.open("wb") as our_log, theirs.open("wb") as their_log:
        for n, side in plan.schedule(args.rounds):
            print(f"round {n}: {side} ({mode})", flush=True)
            try:
                if side == SPECLANE:
                    record = await speclane_round(mode, model_dir, args, our_log)
                else:
                    record = await mlx_round(model_dir, args, their_log)
            except (RuntimeError, OSError, TimeoutError) as e:  # a server that did not start
                record = {"mode": mode, "errors": [f"{type(e).__name__}: {e}"]}
            rounds.append({"round": n, "side": side, **record})
            print(f"  {rounds[-1]}", flush=True)
    environment_record = {
        "versions": environment.versions(),
        "hardware": environment.hardware(),
        "load_average_before": load_before,
        "load_average_after": environment.load_average(),
    }
    return {
        "bench": "cold",
        "date": environment.now_iso(),
        "commit": commit(),
        "mode": mode,
        "rounds": args.rounds,
        "model": str(model_dir),
        "layout": args.layout,
        "max_tokens": args.max_tokens,
        "warm": args.warm,
        "environment": environment_record,
        "rounds_detail": rounds,
        "summary": summary(rounds),
    }
