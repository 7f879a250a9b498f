"""``speclane bench distributed``: a group of ranks on this machine (``mlx.launch --backend
ring``, every rank on 127.0.0.1), first ``mlx_lm.server`` on it (plain distributed decoding:
it refuses draft models there), then speclane with ``[lanes.group]`` on the same hosts. One
copy-heavy stream each (a model asked to copy a function): speclane plain (the group
protocol's own cost), drafting by prompt lookup, and with the copied text as the request's
``prediction``. Greedy: every target must write the same text.

Ranks sharing one CPU measure the protocol's overhead and the draft's saving of whole passes,
not a real link between machines."""

from __future__ import annotations

import argparse
import contextlib
import sys
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp

from router.bench.common import BENCH_CLIENT, environment, procs
from router.bench.common.stream import Reply, chat
from router.config.names import CLIENT_HEADER, LANE_HEADER

SNIPPET = '''def merge_intervals(intervals):
    """Merge overlapping intervals, sorted by start."""
    if not intervals:
        return []
    ordered = sorted(intervals, key=lambda pair: pair[0])
    merged = [list(ordered[0])]
    for start, end in ordered[1:]:
        if start <= merged[-1][1]:
            merged[-1][1] = max(merged[-1][1], end)
        else:
            merged.append([start, end])
    return merged
'''
TASK = f"Copy this function exactly, with no other text:\n\n```python\n{SNIPPET}```"
PLAIN = "mlx_lm.server"
SPECLANE: dict[str, dict[str, Any]] = {
    "speclane:plain": {"num_draft_tokens": 0},
    "speclane:prompt_lookup": {"draft_source": "prompt_lookup"},
    "speclane:prediction": {
        "prediction": {"type": "content", "content": f"```python\n{SNIPPET}```"}
    },
}
TARGETS = (PLAIN, *SPECLANE)


def model_dir(args: argparse.Namespace) -> Path:
    if args.model:
        return Path(args.model).expanduser()
    from router.lanes.modelprep import ensure_default_models

    return ensure_default_models(quiet=True)[0]


def group_config(model: Path, hosts: list[str]) -> str:
    quoted = ", ".join(f'"{h}"' for h in hosts)
    return (
        'log_level = "info"\nshutdown_grace = 2\n[lanes]\n'
        f'model = "{model}"\ndraft_source = "auto"\nstartup_timeout = 1800\n'
        f"[lanes.group]\nhosts = [{quoted}]\n"
        # the speculative lane alone, as measured (a group serves both lanes by default)
        "[lanes.batching]\nenabled = false\n"
    )


@contextlib.asynccontextmanager
async def mlx_lm_group(model: Path, hosts: list[str], log_path: Path) -> AsyncIterator[str]:
    """``mlx.launch --backend ring --hosts ... -- python -m mlx_lm.server`` (rank 0 answers)."""
    from router.lanes.rankgroup import free_port_range, launcher

    launch = [*launcher(sys.executable), "--backend", "ring", "--hosts", ",".join(hosts)]
    launch += ["--starting-port", str(free_port_range(len(hosts))), "--"]
    async with procs.mlx_lm_server(model, log_path, launch=launch, start_seconds=1800.0) as served:
        yield served.url


@contextlib.asynccontextmanager
async def speclane_group(model: Path, hosts: list[str], log_path: Path) -> AsyncIterator[str]:
    with log_path.open("wb") as log:
        config = group_config(model, hosts)
        async with procs._router(config, procs.POLICIES, (), 1800.0, log) as served:
            yield served.url


def measured(name: str, reply: Reply) -> dict[str, Any]:
    times = reply.token_times
    decode = (times[-1] - times[0]) if len(times) > 1 else None
    tokens = reply.completion_tokens
    spec = reply.usage.get("speclane_spec") if isinstance(reply.usage, dict) else None
    return {
        "target": name,
        "error": reply.error,
        "completion_tokens": tokens,
        "ttft_s": reply.ttft,
        "decode_s": decode,
        # after the first token: what the draft changes (the first is a plain step)
        "decode_tok_s": (tokens - 1) / decode if decode and tokens > 1 else None,
        "total_s": (times[-1] - reply.sent) if times else None,
        "spec": spec,
        "load_average": environment.load_average(),  # after the stream: a shared machine
        "text": reply.text,
    }


async def one(
    session: aiohttp.ClientSession,
    url: str,
    model: str,
    max_tokens: int,
    extra: dict[str, Any],
    headers: dict[str, str],
) -> Reply:
    body = {
        "model": model,
        "messages": [{"role": "user", "content": TASK}],
        "max_tokens": max_tokens,
        "temperature": 0,
        **extra,
    }
    return await chat(session, url, body, headers)


async def run(args: argparse.Namespace) -> dict[str, Any]:
    model = model_dir(args)
    hosts = ["127.0.0.1"] * args.ranks
    runs: list[dict[str, Any]] = []
    timeout = aiohttp.ClientTimeout(total=None, sock_read=1800)
    out: Path = args.out
    out.parent.mkdir(parents=True, exist_ok=True)
    machine = environment.record()  # before anything starts: the load others put on it
    started = time.time()
    async with aiohttp.ClientSession(timeout=timeout) as session:
        if PLAIN in args.targets:
            async with mlx_lm_group(model, hosts, out.with_suffix(".mlx_lm.log")) as url:
                for _ in range(args.repeats):
                    reply = await one(session, url, "default_model", args.max_tokens, {}, {})
                    runs.append(measured(PLAIN, reply))
                    log(runs[-1])
        wanted = [t for t in SPECLANE if t in args.targets]
        if wanted:
            async with speclane_group(model, hosts, out.with_suffix(".router.log")) as url:
                headers = {LANE_HEADER: "speculative", CLIENT_HEADER: BENCH_CLIENT}
                name = model.name
                for _ in range(args.repeats):
                    for target in wanted:
                        reply = await one(
                            session, url, name, args.max_tokens, SPECLANE[target], headers
                        )
                        runs.append(measured(target, reply))
                        log(runs[-1])
    return {
        "benchmark": "distributed",
        "environment": machine,
        "environment_at": "start",
        "model": str(model),
        "hosts": hosts,
        "backend": "ring",
        "parallel": "tensor",
        "max_tokens": args.max_tokens,
        "task": TASK,
        "seconds": time.time() - started,
        "runs": runs,
    }


def log(run: dict[str, Any]) -> None:
    rate = run["decode_tok_s"]
    print(
        f"{run['target']}: {run['completion_tokens']} tokens, "
        f"{'-' if rate is None else f'{rate:.2f}'} tok/s after the first"
        + (f" (error: {run['error']})" if run["error"] else ""),
        flush=True,
    )
