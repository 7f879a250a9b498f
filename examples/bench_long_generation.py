"""What one client's long generation costs another client (issue #36, class 3): a short
request's latency alone, then while another client's request without ``max_tokens`` runs
towards the end of the context, under a policy without a cap and under one with the shipped
default policy's cap (``policies/default.toml``, ``[caps] max_tokens``).

    python examples/bench_long_generation.py [--short 5] [--short-tokens 16] [--cap N]
        [--hold 0] [--out FILE]

Starts its own router (``speclane serve``, both lanes on the default model) with three
policies picked by ``X-Speclane-Client``: ``short`` (the other client), ``uncapped`` (no
cap: what a policy without one allowed) and ``capped`` (``max_tokens`` = ``--cap``, default
the shipped default policy's). For each of ``alone``, ``uncapped``, ``capped`` it sends
``--short`` short requests one after another (after the long request's first token) and
prints their median and worst latency and the factor against ``alone``; for the long
requests, the lane, the tokens generated while the short ones ran, the decode rate and how
long the request holds its lane: to the context (uncapped) or to the cap (capped), at the
measured rate. ``--hold S``: let each long request run S more seconds before it is cancelled
(0: cancelled once the short ones are done; the times beyond are computed, not waited for).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import statistics
import sys
import tempfile
import time
import tomllib
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp

from router.bench.common import procs
from router.bench.common.stream import Reply, chat
from router.lanes.modelprep import DEFAULT_MODEL_NAME, ensure_default_models

ROOT = Path(__file__).resolve().parent.parent
CONTEXT = 8192  # the default model's context (max_position_embeddings)
LONG_PROMPT = "Count from 1 to 100000, one number per line, and nothing else."
SHORT_PROMPT = "What is the capital of France? One word."


def shipped_cap() -> int | None:
    caps = tomllib.loads((ROOT / "policies" / "default.toml").read_text()).get("caps", {})
    cap = caps.get("max_tokens")
    return cap if isinstance(cap, int) else None


def policies(cap: int) -> dict[str, str]:
    def policy(name: str, caps: str = "") -> str:
        return f'client = "{name}"\n{caps}[match]\nclient_header = ["{name}"]\n'

    return {
        "default.toml": 'client = "default"\n',
        "short.toml": policy("short"),
        "uncapped.toml": policy("uncapped"),
        "capped.toml": policy("capped", f"[caps]\nmax_tokens = {cap}\n"),
    }


@contextlib.asynccontextmanager
async def router(cap: int, log: Path) -> AsyncIterator[str]:
    with tempfile.TemporaryDirectory(prefix="speclane-long-") as tmp, log.open("wb") as sink:
        folder = procs.write_policies(Path(tmp) / "policies", policies(cap))
        config = Path(tmp) / "speclane.toml"
        config.write_text(
            f"policies_dir = {json.dumps(str(folder))}\n"
            + procs.lanes_config(procs.LaneOptions(max_batch_size=4))
        )
        argv = [sys.executable, "-m", "router", "serve", "--config", str(config), "--port", "0"]
        proc, m = await procs.spawn_until_line(
            argv, r"speclane listening on (http://\S+)", 600, procs.router_env(), sink
        )
        drainer = asyncio.create_task(procs.drain(proc.stdout, sink))
        try:
            yield m.group(1)
        finally:
            await procs.stop(proc, 15.0, group=True)
            drainer.cancel()


async def short_requests(
    session: aiohttp.ClientSession, url: str, count: int, tokens: int
) -> list[float]:
    seconds = []
    for _ in range(count):
        body = {
            "model": DEFAULT_MODEL_NAME,
            "messages": [{"role": "user", "content": SHORT_PROMPT}],
            "max_tokens": tokens,
            "temperature": 0,
        }
        began = time.perf_counter()
        reply = await chat(session, url, body, {"X-Speclane-Client": "short"})
        if reply.error:
            raise RuntimeError(f"short request failed: {reply.error}")
        seconds.append(time.perf_counter() - began)
    return seconds


async def scenario(
    session: aiohttp.ClientSession, url: str, long_client: str | None, args: argparse.Namespace
) -> dict[str, Any]:
    if long_client is None:
        return {"short_seconds": await short_requests(session, url, args.short, args.short_tokens)}
    first = asyncio.Event()
    reply = Reply()
    body = {  # no max_tokens: the policy's cap, if any, is all that bounds it
        "model": DEFAULT_MODEL_NAME,
        "messages": [{"role": "user", "content": LONG_PROMPT}],
        "temperature": 0,
    }

    def seen(_: dict[str, Any]) -> bool:
        first.set()
        return False

    long = asyncio.create_task(
        chat(session, url, body, {"X-Speclane-Client": long_client}, reply, seen)
    )
    await asyncio.wait(
        {long, asyncio.create_task(first.wait())}, return_when=asyncio.FIRST_COMPLETED
    )
    if long.done():
        raise RuntimeError(f"the long request ended before its first token: {reply.error}")
    began_tokens = len(reply.token_times)
    shorts = await short_requests(session, url, args.short, args.short_tokens)
    during = len(reply.token_times) - began_tokens
    if args.hold:
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(asyncio.shield(long), args.hold)
    long.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await long
    rate = reply.decode_rate() or 0.0
    prompt = int(reply.usage.get("prompt_tokens") or 40)
    bound = args.cap if long_client == "capped" else CONTEXT - prompt
    return {
        "short_seconds": shorts,
        "long_lane": reply.headers.get("X-Speclane-Lane"),
        "long_tokens_while_short_ran": during,
        "long_tokens": len(reply.token_times),
        "long_decode_tok_s": round(rate, 2),
        "long_token_bound": bound,
        "long_holds_lane_s": round(bound / rate, 1) if rate else None,
    }


def report(results: dict[str, dict[str, Any]]) -> str:
    alone = statistics.median(results["alone"]["short_seconds"])
    lines = [
        "| scenario | short median s | short worst s | factor vs alone | long lane | "
        "long tok/s | long bound (tokens) | long holds its lane (s) |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for name, r in results.items():
        median = statistics.median(r["short_seconds"])
        lines.append(
            f"| {name} | {median:.2f} | {max(r['short_seconds']):.2f} | {median / alone:.2f} | "
            f"{r.get('long_lane', '-')} | {r.get('long_decode_tok_s', '-')} | "
            f"{r.get('long_token_bound', '-')} | {r.get('long_holds_lane_s', '-')} |"
        )
    return "\n".join(lines)


async def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--short", type=int, default=5, help="short requests per scenario")
    p.add_argument("--short-tokens", type=int, default=16, help="max_tokens of a short request")
    p.add_argument("--cap", type=int, default=shipped_cap(), help="the capped policy's max_tokens")
    p.add_argument("--hold", type=float, default=0.0, help="seconds a long request runs on")
    p.add_argument("--out", type=Path, help="also write the figures (JSON) here")
    args = p.parse_args()
    if args.cap is None:
        p.error("policies/default.toml names no max_tokens cap: give --cap")
    await asyncio.to_thread(ensure_default_models, quiet=True)
    log = Path(tempfile.gettempdir()) / "speclane-bench-long-generation.log"
    results: dict[str, dict[str, Any]] = {}
    timeout = aiohttp.ClientTimeout(total=None, sock_read=600)
    async with router(args.cap, log) as base, aiohttp.ClientSession(timeout=timeout) as session:
        url = base  # the router prints its OpenAI base (…/v1)
        await short_requests(session, url, 1, 2)  # warm both the model and the prompt path
        for name, client in (("alone", None), ("uncapped", "uncapped"), ("capped", "capped")):
            results[name] = await scenario(session, url, client, args)
            print(f"{name}: {results[name]}", flush=True)
    print(report(results))
    print(f"(router log: {log})")
    if args.out:
        args.out.write_text(json.dumps({"cap": args.cap, "results": results}, indent=2))


if __name__ == "__main__":
    asyncio.run(main())
