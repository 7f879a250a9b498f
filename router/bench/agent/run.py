"""``speclane bench agent``: an agent-shaped conversation (a long system prompt and tools
resent every turn), concurrent short streams and a starvation test, against speclane's
batching lane and ``mlx_lm.server`` on the same model directory. Both servers stay up for
the whole run and the measurements alternate between them, so that a shared machine's load
weighs on both alike. The goals (``report.py``) are ratios from one run."""

from __future__ import annotations

import argparse
import asyncio
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp

from router.bench.agent.plan import QUESTIONS, TOOLS, long_document, system_prompt
from router.bench.agent.report import fmt_row, largest_gap, ratios
from router.bench.common import environment, procs
from router.bench.common.stats import fmt, mean
from router.bench.common.stream import Reply, stream
from router.config.names import LANE_HEADER

LANE_HEADERS = {LANE_HEADER: "batching"}
NO_EOS = {"0": -100, "2": -100}  # SmolLM2's end-of-text tokens (the default model)
REQUEST_TIMEOUT = 1800.0


async def stream_chat(
    session: aiohttp.ClientSession,
    base_url: str,
    body: dict[str, Any],
    headers: dict[str, str] | None = None,
    stop_when: asyncio.Event | None = None,
    into: Reply | None = None,
    after: tuple[int, asyncio.Event] | None = None,
) -> Reply:
    """A streaming chat completion (into ``into`` when given, so that a caller can watch it
    while it runs). ``after`` = (n, event): set the event once n tokens have arrived."""
    reply = into or Reply()

    def on_chunk(chunk: dict[str, Any]) -> bool:
        if after is not None and len(reply.token_times) >= after[0]:
            after[1].set()
        return stop_when is not None and stop_when.is_set()

    return await stream(
        session,
        f"{base_url}/chat/completions",
        {**body, "stream": True, "stream_options": {"include_usage": True}},
        headers or {},
        reply,
        on_chunk,
    )


@dataclass
class Target:
    name: str
    base_url: str
    headers: dict[str, str]
    model: str


async def conversation(
    session: aiohttp.ClientSession,
    targets: Sequence[Target],
    system: str,
    turns: int,
    max_tokens: int,
) -> dict[str, list[Any]]:
    """The same conversation with every target, turn by turn (targets alternate, so that
    the machine's changing load weighs on each alike); each target's own answers are
    appended, as an agent would."""
    messages = {t.name: [{"role": "system", "content": system}] for t in targets}
    rows: dict[str, list[Any]] = {t.name: [] for t in targets}
    for turn in range(turns):
        for t in targets:
            history = messages[t.name]
            history.append({"role": "user", "content": QUESTIONS[turn % len(QUESTIONS)]})
            body = {
                "model": t.model,
                "messages": history,
                "tools": TOOLS,
                "tool_choice": "auto",
                "max_tokens": max_tokens,
                "temperature": 0,
            }
            s = await stream_chat(session, t.base_url, body, t.headers)
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


async def concurrent(
    session: aiohttp.ClientSession, t: Target, level: int, max_tokens: int
) -> dict[str, Any]:
    bodies = [
        {
            "model": t.model,
            "max_tokens": max_tokens,
            "temperature": 0,
            "logit_bias": NO_EOS,
            "messages": [{"role": "user", "content": f"Tell story number {i} about a cat."}],
        }
        for i in range(level)
    ]
    started = time.perf_counter()
    streams = await asyncio.gather(
        *(stream_chat(session, t.base_url, b, t.headers) for b in bodies)
    )
    wall = time.perf_counter() - started
    tokens = sum(s.completion_tokens for s in streams)
    rate = tokens / wall if wall > 0 else None
    row = {
        "concurrency": level,
        "tokens": tokens,
        "wall_s": wall,
        "aggregate_tok_s": rate,
        "errors": [s.error for s in streams if s.error],
    }
    print(
        f"  {t.name} concurrency {level}: {tokens} tokens in {wall:.1f}s = {fmt(rate)} tok/s",
        flush=True,
    )
    return row


async def starvation(
    session: aiohttp.ClientSession, t: Target, long_tokens: int, topic: str
) -> dict[str, Any]:
    """A short stream decodes; a long new prompt arrives; the short stream's largest gap."""
    short_started, done = asyncio.Event(), asyncio.Event()  # 3 short tokens; long answered
    short_body = {
        "model": t.model,
        "max_tokens": 4000,
        "temperature": 0,
        "logit_bias": NO_EOS,
        "messages": [{"role": "user", "content": "Count upwards from one."}],
    }

    short_stream = Reply()
    short_task = asyncio.create_task(
        stream_chat(
            session,
            t.base_url,
            short_body,
            t.headers,
            stop_when=done,
            into=short_stream,
            after=(3, short_started),
        )
    )
    watcher = asyncio.create_task(short_started.wait())
    await asyncio.wait({short_task, watcher}, return_when=asyncio.FIRST_COMPLETED)
    watcher.cancel()
    long_body = {
        "model": t.model,
        "max_tokens": 1,
        "temperature": 0,
        "messages": [
            {"role": "user", "content": long_document(long_tokens, topic) + "\nSummarise the log."}
        ],
    }
    long = await stream_chat(session, t.base_url, long_body, t.headers)
    done.set()
    await short_task
    end = long.token_times[0] if long.token_times else time.perf_counter()
    gap = largest_gap(short_stream.token_times, long.sent, end)
    row = {
        "long_prompt_tokens": long.usage.get("prompt_tokens"),
        "long_ttft_s": long.ttft,
        "short_tokens_during_prefill": sum(long.sent <= x <= end for x in short_stream.token_times),
        "largest_gap_s": gap,
        "short_ended_early": bool(short_stream.token_times) and short_stream.token_times[-1] < end,
        "errors": [e for e in (long.error, short_stream.error) if e],
    }
    print(
        f"  {t.name} starvation: long prompt {row['long_prompt_tokens']} tokens, first token "
        f"after {fmt(long.ttft)}s; short stream: {row['short_tokens_during_prefill']} tokens "
        f"meanwhile, largest gap {fmt(gap)}s",
        flush=True,
    )
    return row


async def measure(targets: Sequence[Target], args: argparse.Namespace) -> dict[str, Any]:
    """Every phase with every target, one target at a time, alternating."""
    timeout = aiohttp.ClientTimeout(total=REQUEST_TIMEOUT)
    out: dict[str, dict[str, Any]] = {t.name: {} for t in targets}
    async with aiohttp.ClientSession(timeout=timeout) as session:
        for t in targets:  # warm-up: first-call costs are not a turn
            await stream_chat(
                session,
                t.base_url,
                {
                    "model": t.model,
                    "max_tokens": 2,
                    "messages": [{"role": "user", "content": "Hi"}],
                },
                t.headers,
            )
        turns = await conversation(
            session, targets, system_prompt(args.system_tokens), args.turns, args.max_tokens
        )
        rounds: dict[str, list[dict[str, Any]]] = {t.name: [] for t in targets}
        for _ in range(args.rounds):
            for t in targets:
                rounds[t.name].append(
                    await concurrent(session, t, args.concurrency, args.concurrent_tokens)
                )
        for t in targets:
            out[t.name]["turns"] = turns[t.name]
            out[t.name]["throughput"] = {
                "concurrency": args.concurrency,
                "aggregate_tok_s": mean([r["aggregate_tok_s"] for r in rounds[t.name]]),
                "rounds": rounds[t.name],
            }
        for t in targets:
            out[t.name]["starvation"] = await starvation(session, t, args.long_tokens, "build")
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
            models = await environment.served_models(session, url)
        targets = [
            Target("mlx_lm.server", mlx.url, {}, "default_model"),  # its --model
            Target("speclane", url, dict(LANE_HEADERS), (models or [model_dir.name])[0]),
        ]
        results = await measure(targets, args)
    return {
        "bench": "agent",
        "date": environment.now_iso(),
        "model": str(model_dir),
        "settings": {k: v for k, v in vars(args).items() if k != "out"},
        "environment": {
            "versions": environment.versions(),
            "hardware": environment.hardware(),
            "load_average": environment.load_average(),
        },
        "results": results,
        "ratios": ratios(results),
    }
