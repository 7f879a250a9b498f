"""``speclane bench lanes``: the measurements, target by target (the phases: the package)."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
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
TIMEOUT = aiohttp.ClientTimeout(total=1800.0)
TOOLS = tools("read", "edit")
LANE_RULES, LANE_QUESTIONS = (RULES[0], RULES[1], RULES[2], RULES[7]), QUESTIONS[:4]


def user(text: str) -> list[dict[str, Any]]:
    return [{"role": "user", "content": text}]


@dataclass(frozen=True)
class Target:
    """A running target; ``pid``: mlx_lm.server's one process (None: speclane)."""

    session: aiohttp.ClientSession
    url: str
    model: str
    pid: int | None

    async def send(
        self, lane: str | None, messages: list[dict[str, Any]], max_tokens: int, **extra: Any
    ) -> Reply:
        """A greedy chat on ``lane`` (None: no lane header, as ``mlx_lm.server`` has none)."""
        body = {"model": self.model, "messages": messages, "max_tokens": max_tokens}
        body = {**body, "temperature": 0, **extra}
        return await chat(self.session, self.url, body, {LANE_HEADER: lane} if lane else {})


async def memory(target: Target) -> dict[str, Any]:
    await asyncio.sleep(MEMORY_SETTLE)
    if target.pid is not None:
        figures = process_memory(target.pid) or {}
        return {**{k: figures.get(k) for k in ("pss_bytes", "rss_bytes")}, "processes": 1}
    async with target.session.get(target.url.removesuffix("/v1") + "/admin/lanes") as resp:
        workers = (await resp.json())["workers"]
    total = {k: sum(w.get(k) or 0 for w in workers) for k in ("pss_bytes", "rss_bytes")}
    return {**total, "processes": len(workers)}


async def mixed(target: Target, args: argparse.Namespace) -> dict[str, Any]:
    """An interactive stream on the speculative lane while the batching lane serves others."""
    lanes = target.pid is None
    stories = [user(f"Tell story number {i} about a cat.") for i in range(args.concurrency)]
    batching, speculative = ("batching", "speculative") if lanes else (None, None)
    batch = [target.send(batching, m, args.concurrent_tokens, logit_bias=NO_EOS) for m in stories]
    count = user("Count from 1 to 40, separated by commas.")
    interactive = target.send(speculative, count, args.interactive_tokens)
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
    target: Target, lanes: list[str | None], args: argparse.Namespace, seed: str
) -> list[dict[str, Any]]:
    """One agent conversation; turn i goes to ``lanes[i % len(lanes)]``; ``seed`` makes two
    conversations' prompts differ from their first token (no shared prefix)."""
    system = system_prompt(args.system_tokens, f"[{seed}] {AGENT}", LANE_RULES)
    messages: list[dict[str, Any]] = [{"role": "system", "content": system}]
    rows = []
    for turn in range(args.turns):
        messages += user(LANE_QUESTIONS[turn % len(LANE_QUESTIONS)])
        on = lanes[turn % len(lanes)]
        s = await target.send(on, messages, args.max_tokens, tools=TOOLS)
        prompt = s.usage.get("prompt_tokens")
        row = {"turn": turn + 1, "lane": on, "ttft_s": s.ttft, "prompt_tokens": prompt}
        rows.append({**row, "cached_tokens": s.cached_tokens, "error": s.error})
        messages.append({"role": "assistant", "content": s.text})
    return rows


async def measure(name: str, target: Target, args: argparse.Namespace) -> dict[str, Any]:
    """Every phase on one target."""
    both: list[str | None] = ["speculative", "batching"] if target.pid is None else [None]
    for on in both:  # the same warm-up
        await target.send(on, user("Hi"), 4)
    out: dict[str, Any] = {"memory": await memory(target)}
    print(f"  {name}: memory {out['memory']}", flush=True)
    out["mixed"] = await mixed(target, args)
    print(f"  {name}: mixed load {out['mixed']}", flush=True)
    out["alternating"] = await conversation(target, both, args, f"{name} a")
    out["one_lane"] = await conversation(target, both[:1], args, f"{name} b")
    out["turn2plus_ttft_s"] = {
        key: mean([r["ttft_s"] for r in out[key] if r["turn"] >= 2])
        for key in ("alternating", "one_lane")
    }
    print(f"  {name}: turn 2+ TTFT {out['turn2plus_ttft_s']}", flush=True)
    return out


@contextlib.asynccontextmanager
async def serving(
    name: str, model: Path, draft: Path, log: Path
) -> AsyncIterator[tuple[str, int | None]]:
    """A running target: its ``/v1`` URL, and mlx_lm.server's pid (None for speclane)."""
    if name == "mlx_lm.server":
        async with procs.mlx_lm_server(model, log, ("--draft-model", str(draft))) as served:
            yield served.url, served.sid
        return
    one_thread = name == SHARED_ONE_THREAD
    layout, threads = ("shared", 1) if one_thread else (name, None)
    options = procs.LaneOptions(str(model), str(draft), layout=layout, shared_threads=threads)
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
        async with serving(name, model, draft, log) as (url, pid):
            served = model.name if pid is None else "default_model"  # mlx_lm.server's --model
            async with aiohttp.ClientSession(timeout=TIMEOUT) as session:
                results[name] = await measure(name, Target(session, url, served, pid), args)
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
