"""``speclane bench agent``: an agent-shaped conversation, concurrent short streams and a
starvation test, against speclane's batching lane and ``mlx_lm.server`` on the same model
directory. Both servers stay up for the whole run and the measurements alternate between
them, so that a shared machine's load weighs on both alike."""

from __future__ import annotations

import argparse
import asyncio
import itertools
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp

from router.bench.agent.report import fmt_row, largest_gap, ratios
from router.bench.common import environment, procs, workload
from router.bench.common.stats import fmt, mean
from router.bench.common.stream import Reply, chat
from router.config.names import LANE_HEADER

TOOLS = workload.tools("read", "edit", "exec")


@dataclass
class Target:
    name: str
    base_url: str
    headers: dict[str, str]
    model: str

    async def chat(self, session: aiohttp.ClientSession, **body: Any) -> Reply:
        return await chat(session, self.base_url, {"model": self.model, **body}, self.headers)

    async def ask(
        self, session: aiohttp.ClientSession, text: str, max_tokens: int, **body: Any
    ) -> Reply:
        """One user message, greedy."""
        user = {"role": "user", "content": text}
        return await self.chat(
            session, max_tokens=max_tokens, temperature=0, messages=[user], **body
        )


async def conversation(
    session: aiohttp.ClientSession, targets: list[Target], args: argparse.Namespace
) -> dict[str, list[Any]]:
    """The same conversation with every target, turn by turn (targets alternate); each
    target's own answers are appended, as an agent would."""
    system = workload.system_prompt(args.system_tokens, f"{workload.AGENT} Follow these rules.")
    messages = {t.name: [{"role": "system", "content": system}] for t in targets}
    rows: dict[str, list[Any]] = {t.name: [] for t in targets}
    for turn, t in itertools.product(range(args.turns), targets):
        history = messages[t.name]
        question = workload.QUESTIONS[turn % len(workload.QUESTIONS)]
        history.append({"role": "user", "content": question})
        body = {"tools": TOOLS, "tool_choice": "auto", "max_tokens": args.max_tokens}
        s = await t.chat(session, messages=history, temperature=0, **body)
        row = {
            "turn": turn + 1,
            "ttft_s": s.ttft,
            "decode_tok_s": s.decode_rate(),
            "prompt_tokens": s.usage.get("prompt_tokens"),
            "cached_tokens": s.cached_tokens,
            "completion_tokens": s.completion_tokens,
            "error": s.error,
        }
        rows[t.name].append(row)
        print(f"  {t.name} turn {turn + 1}: " + fmt_row(row), flush=True)
        history.append({"role": "assistant", "content": s.text})
    return rows


async def concurrent(session: aiohttp.ClientSession, t: Target, args: argparse.Namespace) -> dict:
    """``--concurrency`` short streams at once (end-of-text banned): aggregate tokens/s."""
    level, bias = args.concurrency, workload.NO_EOS
    stories = [f"Tell story number {i} about a cat." for i in range(level)]
    started = time.perf_counter()
    streams = await asyncio.gather(
        *(t.ask(session, story, args.concurrent_tokens, logit_bias=bias) for story in stories)
    )
    wall = time.perf_counter() - started
    tokens = sum(s.completion_tokens for s in streams)
    rate = tokens / wall if wall > 0 else None
    print(f"  {t.name} concurrency {level}: {tokens} tokens in {wall:.1f}s = {fmt(rate)} tok/s")
    return {
        "concurrency": level,
        "tokens": tokens,
        "wall_s": wall,
        "aggregate_tok_s": rate,
        "errors": [s.error for s in streams if s.error],
    }


async def starvation(session: aiohttp.ClientSession, t: Target, long_tokens: int) -> dict[str, Any]:
    """A short stream decodes; a long new prompt arrives; the short stream's largest gap."""
    short, short_started, done = Reply(), asyncio.Event(), asyncio.Event()

    def watch(chunk: dict[str, Any]) -> bool:  # 3 short tokens: send the long prompt
        if len(short.token_times) >= 3:
            short_started.set()
        return done.is_set()  # the long prompt answered: stop the short stream

    count = [{"role": "user", "content": "Count upwards from one."}]
    body = {"model": t.model, "max_tokens": 4000, "temperature": 0, "logit_bias": workload.NO_EOS}
    short_task = asyncio.create_task(
        chat(session, t.base_url, {**body, "messages": count}, t.headers, short, watch)
    )
    watcher = asyncio.create_task(short_started.wait())
    await asyncio.wait({short_task, watcher}, return_when=asyncio.FIRST_COMPLETED)
    watcher.cancel()
    document = workload.long_document(long_tokens, "build") + "\nSummarise the log."
    long = await t.ask(session, document, 1)
    done.set()
    await short_task
    end = long.token_times[0] if long.token_times else time.perf_counter()
    gap = largest_gap(short.token_times, long.sent, end)
    row = {
        "long_prompt_tokens": long.usage.get("prompt_tokens"),
        "long_ttft_s": long.ttft,
        "short_tokens_during_prefill": sum(long.sent <= x <= end for x in short.token_times),
        "largest_gap_s": gap,
        "short_ended_early": bool(short.token_times) and short.token_times[-1] < end,
        "errors": [e for e in (long.error, short.error) if e],
    }
    print(
        f"  {t.name} starvation: long prompt {row['long_prompt_tokens']} tokens, first token "
        f"after {fmt(long.ttft)}s; short stream: {row['short_tokens_during_prefill']} tokens "
        f"meanwhile, largest gap {fmt(gap)}s",
        flush=True,
    )
    return row


async def measure(targets: list[Target], args: argparse.Namespace) -> dict[str, Any]:
    """Every phase with every target, one target at a time, alternating."""
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=1800)) as session:
        for t in targets:  # warm-up: first-call costs are not a turn
            await t.chat(session, max_tokens=2, messages=[{"role": "user", "content": "Hi"}])
        turns = await conversation(session, targets, args)
        rounds: dict[str, list[dict[str, Any]]] = {t.name: [] for t in targets}
        for _, t in itertools.product(range(args.rounds), targets):
            rounds[t.name].append(await concurrent(session, t, args))
        out: dict[str, Any] = {}
        for t in targets:
            tok_s = mean([r["aggregate_tok_s"] for r in rounds[t.name]])
            throughput = {"concurrency": args.concurrency, "aggregate_tok_s": tok_s}
            out[t.name] = {
                "turns": turns[t.name],
                "throughput": throughput | {"rounds": rounds[t.name]},
            }
        for t in targets:
            out[t.name]["starvation"] = await starvation(session, t, args.long_tokens)
    return out


async def run(args: argparse.Namespace) -> dict[str, Any]:
    from router.lanes.modelprep import ensure_default_models

    model_dir = Path(args.model) if args.model else ensure_default_models(quiet=True)[0]
    args.out.parent.mkdir(parents=True, exist_ok=True)
    print(f"starting mlx_lm.server and speclane on {model_dir}", flush=True)
    lanes = procs.LaneOptions(model=str(model_dir), max_batch_size=max(8, args.concurrency))
    async with (
        procs.mlx_lm_server(model_dir, args.out.with_suffix(".mlx_lm.log")) as mlx,
        procs.own_router(lanes, args.out.with_suffix(".router.log")) as url,
    ):
        async with aiohttp.ClientSession() as session:
            model = (await environment.served_models(session, url) or [model_dir.name])[0]
        targets = [
            Target("mlx_lm.server", mlx.url, {}, "default_model"),  # its --model
            Target("speclane", url, {LANE_HEADER: "batching"}, model),
        ]
        results = await measure(targets, args)
    return {
        "bench": "agent",
        "date": environment.now_iso(),
        "model": str(model_dir),
        "settings": {k: v for k, v in vars(args).items() if k != "out"},
        "environment": environment.record(),
        "results": results,
        "ratios": ratios(results),
    }
