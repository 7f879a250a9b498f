"""``speclane bench overhead``: what the router adds, direct vs through speclane (vs nginx).

A synthetic upstream answers instantly; a load generator in this process drives closed
loops of streaming requests at each concurrency for a fixed time, then non-streaming ones.
Two stream lengths (``--tokens``): short answers (7 tokens, 10 events), where the cost of
each request dominates, and long ones (256 tokens), where the cost of relaying each chunk
does, as in a real LLM answer. Reported per target: TTFT (to the first body bytes) and
total latency p50/p99, relayed chunks/s, non-streaming requests/s; and for the proxies,
what they add over direct. Load generator, upstream and proxy share the machine's cores:
compare proxies measured in the same run, not against figures from elsewhere.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import platform
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from pathlib import Path

import aiohttp

from router import __version__
from router.bench import procs
from router.bench.stats import percentile

DEFAULT_TOKENS = (7, 256)


def stream_body(tokens: int) -> bytes:
    """A streaming request; the bench upstream answers with ``max_tokens`` content chunks."""
    return json.dumps({"model": "bench-model", "stream": True, "max_tokens": tokens,
                       "messages": [{"role": "user", "content": "hi"}]}).encode()


PLAIN_BODY = json.dumps({"model": "bench-model",
                         "messages": [{"role": "user", "content": "hi"}]}).encode()


@dataclass
class Level:
    target: str
    concurrency: int
    tokens: int = DEFAULT_TOKENS[0]
    requests: int = 0
    errors: int = 0
    chunks: int = 0
    seconds: float = 0.0
    ttft_ms: list[float] = field(default_factory=list)
    total_ms: list[float] = field(default_factory=list)
    plain_requests: int = 0
    plain_seconds: float = 0.0

    def add(self, other: Level) -> None:
        """Pool another round of the same cell into this one."""
        self.requests += other.requests
        self.errors += other.errors
        self.chunks += other.chunks
        self.seconds += other.seconds
        self.ttft_ms += other.ttft_ms
        self.total_ms += other.total_ms
        self.plain_requests += other.plain_requests
        self.plain_seconds += other.plain_seconds

    def summary(self) -> dict[str, float | int | str | None]:
        return {
            "target": self.target, "concurrency": self.concurrency, "tokens": self.tokens,
            "requests": self.requests, "errors": self.errors,
            "ttft_p50_ms": percentile(self.ttft_ms, 50),
            "ttft_p99_ms": percentile(self.ttft_ms, 99),
            "total_p50_ms": percentile(self.total_ms, 50),
            "total_p99_ms": percentile(self.total_ms, 99),
            "chunks_per_s": self.chunks / self.seconds if self.seconds else None,
            "plain_requests_per_s": (self.plain_requests / self.plain_seconds
                                     if self.plain_seconds else None),
        }


async def _stream_once(session: aiohttp.ClientSession, url: str, body: bytes,
                       level: Level) -> None:
    start = time.perf_counter()
    first = None
    chunks = 0
    async with session.post(url, data=body,
                            headers={"Content-Type": "application/json"}) as resp:
        if resp.status != 200:
            level.errors += 1
            await resp.read()
            return
        async for data in resp.content.iter_any():
            if first is None:
                first = time.perf_counter()
            chunks += data.count(b"\n\n")
    end = time.perf_counter()
    level.requests += 1
    level.chunks += chunks
    level.ttft_ms.append(((first or end) - start) * 1000)
    level.total_ms.append((end - start) * 1000)


async def _plain_once(session: aiohttp.ClientSession, url: str, level: Level) -> None:
    async with session.post(url, data=PLAIN_BODY,
                            headers={"Content-Type": "application/json"}) as resp:
        await resp.read()
        if resp.status == 200:
            level.plain_requests += 1
        else:
            level.errors += 1


async def _closed_loop(concurrency: int, seconds: float,
                       once: Callable[[], asyncio.Future[None] | object]) -> float:
    deadline = time.perf_counter() + seconds

    async def worker() -> None:
        while time.perf_counter() < deadline:
            try:
                await once()  # type: ignore[misc]
            except (aiohttp.ClientError, TimeoutError):
                pass

    start = time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(concurrency)))
    return time.perf_counter() - start


async def measure(target: str, base_url: str, concurrency: int, seconds: float,
                  warmup: float, tokens: int = DEFAULT_TOKENS[0], plain: bool = True) -> Level:
    level = Level(target, concurrency, tokens)
    url = f"{base_url}/chat/completions"
    body = stream_body(tokens)
    connector = aiohttp.TCPConnector(limit=0, force_close=False)
    async with aiohttp.ClientSession(connector=connector) as session:
        warm = Level(target, concurrency, tokens)
        await _closed_loop(concurrency, warmup, lambda: _stream_once(session, url, body, warm))
        level.seconds = await _closed_loop(concurrency, seconds,
                                           lambda: _stream_once(session, url, body, level))
        if plain:
            level.plain_seconds = await _closed_loop(concurrency, seconds / 2,
                                                     lambda: _plain_once(session, url, level))
    return level


@contextlib.asynccontextmanager
async def _targets(with_nginx: bool) -> AsyncIterator[dict[str, str]]:
    async with procs.bench_upstream() as upstream, contextlib.AsyncExitStack() as stack:
        targets = {"direct": upstream}
        targets["speclane"] = await stack.enter_async_context(procs.speclane_router(upstream))
        if with_nginx:
            targets["nginx"] = await stack.enter_async_context(procs.nginx_proxy(upstream))
        yield targets


async def run(concurrencies: list[int], seconds: float, warmup: float,
              nginx: str, tokens: tuple[int, ...] = DEFAULT_TOKENS,
              rounds: int = 1) -> dict[str, object]:
    """Each (stream length, concurrency) cell is measured in ``rounds`` rounds that visit
    the targets in turn, starting with a different one each round, and the rounds are
    pooled: on a shared machine a burst of someone else's work then lands on every target
    alike instead of on whichever was being measured."""
    with_nginx = nginx == "on" or (nginx == "auto" and procs.nginx_binary() is not None)
    rows: list[dict[str, object]] = []
    async with _targets(with_nginx) as targets:
        names = list(targets)
        for n, length in enumerate(tokens):
            for c in concurrencies:
                pooled = {name: Level(name, c, length) for name in names}
                for r in range(rounds):
                    for name in names[r % len(names):] + names[:r % len(names)]:
                        # Non-streaming requests/s does not depend on the stream length.
                        pooled[name].add(await measure(name, targets[name], c, seconds, warmup,
                                                       length, plain=n == 0))
                for name in names:
                    rows.append(pooled[name].summary())
                    print(f"  measured {name:<8} c={c:<3} {length:>4} tokens: "
                          f"{pooled[name].requests} streams", flush=True)
    result: dict[str, object] = {
        "benchmark": "overhead", "speclane": __version__,
        "date": datetime.now(UTC).isoformat(timespec="seconds"),
        "machine": {"platform": platform.platform(), "python": platform.python_version(),
                    "cpus": _cpus()},
        "seconds_per_level": seconds, "rounds": rounds, "nginx": with_nginx,
        "tokens": list(tokens),
        "rows": rows, "added": added_over_direct(rows),
    }
    result["targets"] = judge_targets(result)
    return result


def added_over_direct(rows: list[dict[str, object]]) -> list[dict[str, object]]:
    direct = {(r["concurrency"], r.get("tokens")): r for r in rows if r["target"] == "direct"}
    added = []
    for r in rows:
        d = direct.get((r["concurrency"], r.get("tokens")))
        if r["target"] == "direct" or d is None:
            continue
        added.append({
            "target": r["target"], "concurrency": r["concurrency"], "tokens": r.get("tokens"),
            **{f"added_{k}": _diff(r[k], d[k]) for k in
               ("ttft_p50_ms", "ttft_p99_ms", "total_p50_ms", "total_p99_ms")},
            "chunks_vs_direct": _ratio(r["chunks_per_s"], d["chunks_per_s"]),
            "plain_vs_direct": _ratio(r["plain_requests_per_s"], d["plain_requests_per_s"]),
        })
    return added


def _diff(a: object, b: object) -> float | None:
    return a - b if isinstance(a, int | float) and isinstance(b, int | float) else None


def _ratio(a: object, b: object) -> float | None:
    return a / b if isinstance(a, int | float) and isinstance(b, int | float) and b else None


def _cpus() -> int:
    import os

    return os.cpu_count() or 0


def render_table(result: dict[str, object]) -> str:
    def f(v: object, spec: str = ".2f") -> str:
        return "-" if v is None else format(v, spec)

    lines = ["| target | conc | tokens | TTFT p50 ms | TTFT p99 ms | total p50 ms |"
             " total p99 ms | chunks/s | non-stream req/s | errors |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for r in result["rows"]:  # type: ignore[attr-defined]
        lines.append(f"| {r['target']} | {r['concurrency']} | {r.get('tokens', '-')} | "
                     f"{f(r['ttft_p50_ms'])} | "
                     f"{f(r['ttft_p99_ms'])} | {f(r['total_p50_ms'])} | {f(r['total_p99_ms'])} | "
                     f"{f(r['chunks_per_s'], '.0f')} | {f(r['plain_requests_per_s'], '.0f')} | "
                     f"{r['errors']} |")
    lines += ["", "| proxy | conc | tokens | added TTFT p50 ms | added TTFT p99 ms |"
              " added total p50 ms | added total p99 ms | chunks/s vs direct | req/s vs direct |",
              "|---|---|---|---|---|---|---|---|---|"]
    for a in result["added"]:  # type: ignore[attr-defined]
        lines.append(f"| {a['target']} | {a['concurrency']} | {a.get('tokens', '-')} | "
                     f"{f(a['added_ttft_p50_ms'])} | "
                     f"{f(a['added_ttft_p99_ms'])} | {f(a['added_total_p50_ms'])} | "
                     f"{f(a['added_total_p99_ms'])} | {f(a['chunks_vs_direct'], '.2f')} | "
                     f"{f(a['plain_vs_direct'], '.2f')} |")
    return "\n".join(lines)


TTFT_TARGET_MS = 1.0  # added TTFT p50 at concurrency 1
THROUGHPUT_TARGET = 0.8  # relayed chunks/s at 64 streams, as a share of direct


def judge_targets(result: dict[str, object]) -> list[dict[str, object]]:
    """speclane's figures against the two targets, one entry per stream length."""
    out: list[dict[str, object]] = []
    added = [a for a in result["added"] if a["target"] == "speclane"]  # type: ignore[attr-defined]
    for a in added:
        if a["concurrency"] == 1:
            v = a["added_ttft_p50_ms"]
            out.append({"target": "added TTFT p50 at concurrency 1", "tokens": a["tokens"],
                        "value": v, "goal": f"< {TTFT_TARGET_MS:g} ms",
                        "met": isinstance(v, int | float) and v < TTFT_TARGET_MS})
        if a["concurrency"] == 64:
            v = a["chunks_vs_direct"]
            out.append({"target": "relayed chunks/s at 64 streams vs direct",
                        "tokens": a["tokens"], "value": v, "goal": f">= {THROUGHPUT_TARGET:g}x",
                        "met": isinstance(v, int | float) and v >= THROUGHPUT_TARGET})
    return out


def render_targets(entries: list[dict[str, object]]) -> str:
    lines = []
    for e in entries:
        v = e["value"]
        shown = "-" if not isinstance(v, int | float) else (
            f"{v:.2f} ms" if "TTFT" in str(e["target"]) else f"{v:.2f}x")
        lines.append(f"{e['target']}, {e['tokens']}-token streams: {shown} "
                     f"(target {e['goal']}): {'met' if e['met'] else 'NOT met'}")
    return "\n".join(lines)


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(prog="speclane bench overhead",
                                description="Measure the latency and throughput speclane adds.")
    p.add_argument("--concurrency", default="1,16,64", help="comma-separated (default 1,16,64)")
    p.add_argument("--tokens", default=",".join(map(str, DEFAULT_TOKENS)),
                   help="comma-separated stream lengths in tokens (default 7,256)")
    p.add_argument("--seconds", type=float, default=3.0,
                   help="measured seconds per target, level and round (default 3)")
    p.add_argument("--rounds", type=int, default=3,
                   help="interleaved rounds pooled per level (default 3)")
    p.add_argument("--warmup", type=float, default=0.5,
                   help="warm-up seconds before each measurement (default 0.5)")
    p.add_argument("--nginx", choices=("auto", "on", "off"), default="auto",
                   help="also measure nginx as a plain reverse proxy (auto: when installed)")
    p.add_argument("--out", type=Path, default=Path("bench-results/overhead.json"))
    args = p.parse_args(argv)
    levels = [int(x) for x in args.concurrency.split(",") if x.strip()]
    tokens = tuple(int(x) for x in args.tokens.split(",") if x.strip())
    print(f"speclane bench overhead: levels {levels}, streams of {list(tokens)} tokens, "
          f"{args.rounds} x {args.seconds:g}s each", flush=True)
    result = asyncio.run(run(levels, args.seconds, args.warmup, args.nginx, tokens,
                             max(1, args.rounds)))
    print(render_table(result))
    print()
    print(render_targets(result["targets"]))  # type: ignore[arg-type]
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2))
    print(f"\nsaved {args.out}")
    return 0


__all__ = [
    "Level",
    "asdict",
    "judge_targets",
    "main",
    "measure",
    "render_table",
    "render_targets",
    "run",
]
