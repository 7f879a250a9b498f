"""``speclane bench lanes``: the measurements, target by target (the phases: the package)."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp

from router.bench.common import environment, procs
from router.bench.common.stats import mean
from router.bench.common.stream import Reply, chat
from router.bench.common.workload import AGENT, NO_EOS, QUESTIONS, RULES, system_prompt, tools
from router.bench.lanes.report import SHARED_ONE_THREAD, ratios
from router.config.names import LANE_HEADER
from router.lanes.memory import process_memory

MEMORY_SETTLE = 3.0  # seconds: one supervisor health poll (which reads the workers' PSS)
REQUEST_TIMEOUT = 1800.0
TOOLS = tools("read", "edit")
LANE_RULES, LANE_QUESTIONS = (RULES[0], RULES[1], RULES[2], RULES[7]), QUESTIONS[:4]


async def send(
    session: aiohttp.ClientSession,
    url: str,
    model: str,
    lane: str | None,
    messages: list[dict[str, Any]],
    max_tokens: int,
    **extra: Any,
) -> Reply:
    """A greedy chat on ``lane`` (None: no lane header, as ``mlx_lm.server`` has none)."""
    body = {"model": model, "messages": messages, "max_tokens": max_tokens, "temperature": 0}
    return await chat(session, url, {**body, **extra}, {LANE_HEADER: lane} if lane else {})


async def memory(session: aiohttp.ClientSession, url: str, pid: int | None) -> dict[str, Any]:
    await asyncio.sleep(MEMORY_SETTLE)
    if pid is not None:  # mlx_lm.server: its one process
        figures = process_memory(pid) or {}
        return {
            "pss_bytes": figures.get("pss_bytes"),
            "rss_bytes": figures.get("rss_bytes"),
            "processes": 1,
        }
    async with session.get(url.removesuffix("/v1") + "/admin/lanes") as resp:
        workers = (await resp.json())["workers"]
    return {
        "pss_bytes": sum(w.get("pss_bytes") or 0 for w in workers),
        "rss_bytes": sum(w.get("rss_bytes") or 0 for w in workers),
        "processes": len(workers),
    }


async def mixed(
    session: aiohttp.ClientSession, url: str, model: str, lanes: bool, args: argparse.Namespace
) -> dict[str, Any]:
    batch = [
        send(
            session,
            url,
            model,
            "batching" if lanes else None,
            [{"role": "user", "content": f"Tell story number {i} about a cat."}],
            args.concurrent_tokens,
            logit_bias=NO_EOS,
        )
        for i in range(args.concurrency)
    ]
    count = [{"role": "user", "content": "Count from 1 to 40, separated by commas."}]
    interactive = send(
        session, url, model, "speculative" if lanes else None, count, args.interactive_tokens
    )
    started = time.perf_counter()  # the clock of Reply.token_times
    first, *others = await asyncio.gather(interactive, *batch)
    ended = max((s.token_times[-1] for s in others if s.token_times), default=time.perf_counter())
    tokens = sum(s.completion_tokens for s in others)
    wall = ended - started
    return {
        "interactive_ttft_s": first.ttft,
        "interactive_tok_s": first.decode_rate(),
        "batch_streams": len(others),
        "batch_tokens": tokens,
        "aggregate_tok_s": tokens / wall if wall > 0 else None,
        "errors": [s.error for s in (first, *others) if s.error],
    }


async def conversation(
    session: aiohttp.ClientSession,
    url: str,
    model: str,
    lanes: list[str | None],
    args: argparse.Namespace,
    seed: str,
) -> list[dict[str, Any]]:
    """One agent conversation; turn i goes to ``lanes[i % len(lanes)]``; ``seed`` makes two
    conversations' prompts differ from their first token (no shared prefix)."""
    system = system_prompt(args.system_tokens, f"[{seed}] {AGENT}", LANE_RULES)
    messages: list[dict[str, Any]] = [{"role": "system", "content": system}]
    rows = []
    for turn in range(args.turns):
        messages.append({"role": "user", "content": LANE_QUESTIONS[turn % len(LANE_QUESTIONS)]})
        on = lanes[turn % len(lanes)]
        s = await send(session, url, model, on, messages, args.max_tokens, tools=TOOLS)
        rows.append(
            {
                "turn": turn + 1,
                "lane": on,
                "ttft_s": s.ttft,
                "prompt_tokens": s.usage.get("prompt_tokens"),
                "cached_tokens": s.cached_tokens,
                "error": s.error,
            }
        )
        messages.append({"role": "assistant", "content": s.text})
    return rows


async def measure(
    name: str, url: str, pid: int | None, model: str, args: argparse.Namespace
) -> dict[str, Any]:
    """Every phase on one target; ``pid``: mlx_lm.server's process (None: speclane)."""
    lanes = pid is None
    both: list[str | None] = ["speculative", "batching"] if lanes else [None]
    timeout = aiohttp.ClientTimeout(total=REQUEST_TIMEOUT)
    async with aiohttp.ClientSession(timeout=timeout) as session:
        for on in both:  # the same warm-up
            await send(session, url, model, on, [{"role": "user", "content": "Hi"}], 4)
        out: dict[str, Any] = {"memory": await memory(session, url, pid)}
        print(f"  {name}: memory {out['memory']}", flush=True)
        out["mixed"] = await mixed(session, url, model, lanes, args)
        print(f"  {name}: mixed load {out['mixed']}", flush=True)
        out["alternating"] = await conversation(session, url, model, both, args, f"{name} a")
        out["one_lane"] = await conversation(session, url, model, both[:1], args, f"{name} b")
        out["turn2plus_ttft_s"] = {
            key: mean([r["ttft_s"] for r in out[key] if r["turn"] >= 2])
            for key in ("alternating", "one_lane")
        }
        print(f"  {name}: turn 2+ TTFT {out['turn2plus_ttft_s']}", flush=True)
    return out


@contextlib.asynccontextmanager
async def target(
    name: str, model: Path, draft: Path, log: Path
) -> AsyncIterator[tuple[str, int | None]]:
    """A running target: its ``/v1`` URL, and mlx_lm.server's pid (None for speclane)."""
    if name == "mlx_lm.server":
        async with procs.mlx_lm_server(model, log, ("--draft-model", str(draft))) as served:
            yield served.url, served.sid
        return
    one_thread = name == SHARED_ONE_THREAD
    options = procs.LaneOptions(
        model=str(model),
        draft_model=str(draft),
        layout="shared" if one_thread else name,
        shared_threads=1 if one_thread else None,
    )
    async with procs.own_router(options, log) as url:
        yield url, None


async def run(args: argparse.Namespace) -> dict[str, Any]:
    from router.lanes.modelprep import ensure_default_models

    default_model, default_draft = ensure_default_models(quiet=True)
    model = Path(args.model) if args.model else default_model
    draft = Path(args.draft_model) if args.draft_model else default_draft
    args.out.parent.mkdir(parents=True, exist_ok=True)
    results = {}
    for name in args.targets:
        print(f"{name}: starting on {model} with draft {draft}", flush=True)
        log = args.out.with_suffix(f".{name.replace('.', '_')}.log")
        async with target(name, model, draft, log) as (url, pid):
            served = model.name if pid is None else "default_model"  # mlx_lm.server's --model
            results[name] = await measure(name, url, pid, served, args)
    return {
        "bench": "lanes",
        "date": environment.now_iso(),
        "model": str(model),
        "draft": str(draft),
        "settings": {k: str(v) for k, v in vars(args).items()},
        "environment": environment.record(),
        "results": results,
        "ratios": ratios(results),
    }
