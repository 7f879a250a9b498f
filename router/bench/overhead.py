"""``speclane bench overhead``: what the router adds, direct vs through speclane (vs nginx).

A synthetic upstream answers instantly; a load generator in this process drives closed
loops of streaming requests at each concurrency for a fixed time, then non-streaming ones.
Two stream lengths (``--tokens``): short answers (7 tokens, 10 events), where the cost of
each request dominates, and long ones (256 tokens), where the cost of relaying each chunk
does, as in a real LLM answer. Reported per target: TTFT (to the first body bytes) and
total latency p50/p99, relayed chunks/s, non-streaming requests/s, the CPU time each
process spent per stream; and for the proxies, what they add over direct.

Two core layouts (``--cpus``): ``shared``, where load generator, upstream and proxy compete
for every core (on a 2-core machine a proxy's throughput ratio is then bounded by its CPU
cost against theirs), and ``own-core`` (Linux), where the proxies get one core to
themselves and upstream and load generator share the rest, for direct and proxied runs
alike: whether the proxy keeps up when it is not starved, as beside a GPU-bound backend.
Compare proxies measured in the same run, not against figures from elsewhere.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import platform
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import aiohttp

from router import __version__
from router.bench import cpu, procs
from router.bench.stats import percentile

DEFAULT_TOKENS = (7, 256)
LAYOUTS = ("shared", "own-core")
ROLES = ("upstream", "proxy", "loadgen")
Row = dict[str, Any]  # one JSON object of the result (a measured row, a target verdict)
Meters = dict[str, Callable[[], float | None]]  # role -> CPU seconds so far


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
    cpus: str = LAYOUTS[0]
    requests: int = 0
    errors: int = 0
    chunks: int = 0
    seconds: float = 0.0
    ttft_ms: list[float] = field(default_factory=list)
    total_ms: list[float] = field(default_factory=list)
    plain_requests: int = 0
    plain_seconds: float = 0.0
    cpu_seconds: dict[str, float] = field(default_factory=dict)  # streaming phase, per role

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
        for role, used in other.cpu_seconds.items():
            self.cpu_seconds[role] = self.cpu_seconds.get(role, 0.0) + used

    def summary(self) -> Row:
        return {
            "target": self.target, "cpus": self.cpus, "concurrency": self.concurrency,
            "tokens": self.tokens, "requests": self.requests, "errors": self.errors,
            "ttft_p50_ms": percentile(self.ttft_ms, 50),
            "ttft_p99_ms": percentile(self.ttft_ms, 99),
            "total_p50_ms": percentile(self.total_ms, 50),
            "total_p99_ms": percentile(self.total_ms, 99),
            "chunks_per_s": self.chunks / self.seconds if self.seconds else None,
            "plain_requests_per_s": (self.plain_requests / self.plain_seconds
                                     if self.plain_seconds else None),
            "cpu_us_per_stream": {role: used / self.requests * 1e6
                                  for role, used in self.cpu_seconds.items()
                                  if self.requests},
        }


def _read(meters: Meters) -> dict[str, float]:
    return {role: v for role, read in meters.items() if (v := read()) is not None}


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
                       once: Callable[[], Awaitable[None]]) -> float:
    deadline = time.perf_counter() + seconds

    async def worker() -> None:
        while time.perf_counter() < deadline:
            try:
                await once()
            except (aiohttp.ClientError, TimeoutError):
                pass

    start = time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(concurrency)))
    return time.perf_counter() - start


async def measure(target: str, base_url: str, concurrency: int, seconds: float,
                  warmup: float, tokens: int = DEFAULT_TOKENS[0], plain: bool = True,
                  meters: Meters | None = None, cpus: str = LAYOUTS[0]) -> Level:
    level = Level(target, concurrency, tokens, cpus)
    url = f"{base_url}/chat/completions"
    body = stream_body(tokens)
    connector = aiohttp.TCPConnector(limit=0, force_close=False)
    async with aiohttp.ClientSession(connector=connector) as session:
        warm = Level(target, concurrency, tokens)
        await _closed_loop(concurrency, warmup, lambda: _stream_once(session, url, body, warm))
        before = _read(meters or {})
        level.seconds = await _closed_loop(concurrency, seconds,
                                           lambda: _stream_once(session, url, body, level))
        after = _read(meters or {})
        level.cpu_seconds = {role: after[role] - before[role]
                             for role in before.keys() & after.keys()}
        if plain:
            level.plain_seconds = await _closed_loop(concurrency, seconds / 2,
                                                     lambda: _plain_once(session, url, level))
    return level


@contextlib.asynccontextmanager
async def _targets(with_nginx: bool) -> AsyncIterator[dict[str, procs.Served]]:
    """The upstream first (as "direct"), then the proxies in front of it."""
    async with procs.bench_upstream() as upstream, contextlib.AsyncExitStack() as stack:
        targets = {"direct": upstream}
        targets["speclane"] = await stack.enter_async_context(
            procs.speclane_router(upstream.url))
        if with_nginx:
            targets["nginx"] = await stack.enter_async_context(procs.nginx_proxy(upstream.url))
        yield targets


def _meters(targets: dict[str, procs.Served], name: str) -> Meters:
    meters: Meters = {"upstream": lambda: cpu.session_cpu_seconds(targets["direct"].sid),
                      "loadgen": cpu.own_cpu_seconds}
    if name != "direct":
        sid = targets[name].sid
        meters["proxy"] = lambda: cpu.session_cpu_seconds(sid)
    return meters


def _arrange(layout: str, targets: dict[str, procs.Served], everything: set[int]) -> None:
    """Pin the processes for a layout; ``shared`` undoes an earlier ``own-core``."""
    if not cpu.supported():
        return
    halves = cpu.split(everything) if layout == "own-core" else None
    proxy_cpus, rest = halves or (everything, everything)
    for name, served in targets.items():
        cpu.pin_session(served.sid, rest if name == "direct" else proxy_cpus)
    cpu.pin_self(rest)


def layouts_for(choice: str) -> tuple[str, ...]:
    """The layouts ``--cpus`` asks for that this machine can do (own-core needs Linux and
    two cores)."""
    wanted = LAYOUTS if choice == "both" else (choice,)
    can_split = cpu.supported() and cpu.split(cpu.allowed_cpus()) is not None
    return tuple(w for w in wanted if w == "shared" or can_split)


async def run(concurrencies: list[int], seconds: float, warmup: float,
              nginx: str, tokens: tuple[int, ...] = DEFAULT_TOKENS,
              rounds: int = 1, cpus: str = "both") -> Row:
    """Each (stream length, concurrency) cell is measured in ``rounds`` rounds that visit
    the targets in turn, starting with a different one each round, and the rounds are
    pooled: on a shared machine a burst of someone else's work then lands on every target
    alike instead of on whichever was being measured."""
    with_nginx = nginx == "on" or (nginx == "auto" and procs.nginx_binary() is not None)
    layouts = layouts_for(cpus)
    if not layouts:
        raise ValueError("the own-core layout needs Linux and at least two cores")
    rows: list[Row] = []
    everything = cpu.allowed_cpus()
    async with _targets(with_nginx) as targets:
        names = list(targets)
        try:
            for layout in layouts:
                _arrange(layout, targets, everything)
                rows += await _measure_layout(layout, targets, names, concurrencies, seconds,
                                              warmup, tokens, rounds)
        finally:
            if cpu.supported() and everything:
                cpu.pin_self(everything)  # a caller in this process keeps its cores
    result: Row = {
        "benchmark": "overhead", "speclane": __version__,
        "date": datetime.now(UTC).isoformat(timespec="seconds"),
        "machine": {"platform": platform.platform(), "python": platform.python_version(),
                    "cpus": _cpus()},
        "seconds_per_level": seconds, "rounds": rounds, "nginx": with_nginx,
        "tokens": list(tokens), "layouts": list(layouts),
        "rows": rows, "added": added_over_direct(rows),
    }
    result["targets"] = judge_targets(result)
    return result


async def _measure_layout(layout: str, targets: dict[str, procs.Served], names: list[str],
                          concurrencies: list[int], seconds: float, warmup: float,
                          tokens: tuple[int, ...], rounds: int) -> list[Row]:
    rows: list[Row] = []
    for n, length in enumerate(tokens):
        for c in concurrencies:
            pooled = {name: Level(name, c, length, layout) for name in names}
            for r in range(rounds):
                for name in names[r % len(names):] + names[:r % len(names)]:
                    # Non-streaming requests/s does not depend on the stream length.
                    pooled[name].add(await measure(
                        name, targets[name].url, c, seconds, warmup, length, plain=n == 0,
                        meters=_meters(targets, name), cpus=layout))
            for name in names:
                rows.append(pooled[name].summary())
                print(f"  measured {name:<8} {layout:<8} c={c:<3} {length:>4} tokens: "
                      f"{pooled[name].requests} streams", flush=True)
    return rows


def _cell(row: Row) -> tuple[object, ...]:
    return row.get("cpus", LAYOUTS[0]), row["concurrency"], row.get("tokens")


def added_over_direct(rows: list[Row]) -> list[Row]:
    direct = {_cell(r): r for r in rows if r["target"] == "direct"}
    added = []
    for r in rows:
        d = direct.get(_cell(r))
        if r["target"] == "direct" or d is None:
            continue
        proxy_cpu = r.get("cpu_us_per_stream", {}).get("proxy")
        added.append({
            "target": r["target"], "cpus": r.get("cpus", LAYOUTS[0]),
            "concurrency": r["concurrency"], "tokens": r.get("tokens"),
            **{f"added_{k}": _diff(r[k], d[k]) for k in
               ("ttft_p50_ms", "ttft_p99_ms", "total_p50_ms", "total_p99_ms")},
            "chunks_vs_direct": _ratio(r["chunks_per_s"], d["chunks_per_s"]),
            "plain_vs_direct": _ratio(r["plain_requests_per_s"], d["plain_requests_per_s"]),
            "proxy_cpu_us_per_stream": proxy_cpu,
        })
    return added


def _diff(a: object, b: object) -> float | None:
    return a - b if isinstance(a, int | float) and isinstance(b, int | float) else None


def _ratio(a: object, b: object) -> float | None:
    return a / b if isinstance(a, int | float) and isinstance(b, int | float) and b else None


def _cpus() -> int:
    import os

    return os.cpu_count() or 0


def render_table(result: Row) -> str:
    def f(v: object, spec: str = ".2f") -> str:
        return "-" if v is None else format(v, spec)

    def cpu_cell(r: Row) -> str:
        per = r.get("cpu_us_per_stream") or {}
        return " / ".join(f(per.get(role), ".0f") for role in ROLES)

    lines = ["| target | cores | conc | tokens | TTFT p50 ms | TTFT p99 ms | total p50 ms |"
             " total p99 ms | chunks/s | non-stream req/s | CPU µs/stream upstream / proxy /"
             " loadgen | errors |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in result["rows"]:
        lines.append(f"| {r['target']} | {r.get('cpus', '-')} | {r['concurrency']} | "
                     f"{r.get('tokens', '-')} | {f(r['ttft_p50_ms'])} | "
                     f"{f(r['ttft_p99_ms'])} | {f(r['total_p50_ms'])} | {f(r['total_p99_ms'])} | "
                     f"{f(r['chunks_per_s'], '.0f')} | {f(r['plain_requests_per_s'], '.0f')} | "
                     f"{cpu_cell(r)} | {r['errors']} |")
    lines += ["", "| proxy | cores | conc | tokens | added TTFT p50 ms | added TTFT p99 ms |"
              " added total p50 ms | added total p99 ms | chunks/s vs direct | req/s vs direct |"
              " proxy CPU µs/stream |",
              "|---|---|---|---|---|---|---|---|---|---|---|"]
    for a in result["added"]:
        lines.append(f"| {a['target']} | {a.get('cpus', '-')} | {a['concurrency']} | "
                     f"{a.get('tokens', '-')} | {f(a['added_ttft_p50_ms'])} | "
                     f"{f(a['added_ttft_p99_ms'])} | {f(a['added_total_p50_ms'])} | "
                     f"{f(a['added_total_p99_ms'])} | {f(a['chunks_vs_direct'], '.2f')} | "
                     f"{f(a['plain_vs_direct'], '.2f')} | "
                     f"{f(a.get('proxy_cpu_us_per_stream'), '.0f')} |")
    return "\n".join(lines)


TTFT_TARGET_MS = 1.0  # added TTFT p50 at concurrency 1
THROUGHPUT_TARGET = 0.8  # relayed chunks/s at 64 streams, as a share of direct


def judge_targets(result: Row) -> list[Row]:
    """speclane's figures against the two targets, one entry per core layout and stream
    length."""
    out: list[Row] = []
    added = [a for a in result["added"] if a["target"] == "speclane"]
    for a in added:
        where = {"tokens": a["tokens"], "cpus": a.get("cpus", LAYOUTS[0])}
        if a["concurrency"] == 1:
            v = a["added_ttft_p50_ms"]
            out.append({"target": "added TTFT p50 at concurrency 1", **where,
                        "value": v, "goal": f"< {TTFT_TARGET_MS:g} ms",
                        "met": isinstance(v, int | float) and v < TTFT_TARGET_MS})
        if a["concurrency"] == 64:
            v = a["chunks_vs_direct"]
            out.append({"target": "relayed chunks/s at 64 streams vs direct", **where,
                        "value": v, "goal": f">= {THROUGHPUT_TARGET:g}x",
                        "met": isinstance(v, int | float) and v >= THROUGHPUT_TARGET})
    return out


def render_targets(entries: list[Row]) -> str:
    lines = []
    for e in entries:
        v = e["value"]
        shown = "-" if not isinstance(v, int | float) else (
            f"{v:.2f} ms" if "TTFT" in str(e["target"]) else f"{v:.2f}x")
        lines.append(f"[{e.get('cpus', LAYOUTS[0])} cores] {e['target']}, {e['tokens']}-token "
                     f"streams: {shown} (target {e['goal']}): {'met' if e['met'] else 'NOT met'}")
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
    p.add_argument("--cpus", choices=("shared", "own-core", "both"), default="both",
                   help="core layout: every process shares every core, the proxies get a "
                        "core of their own (Linux, 2+ cores), or both in turn (default both; "
                        "own-core is skipped where it cannot be done)")
    p.add_argument("--out", type=Path, default=Path("bench-results/overhead.json"),
                   help="where to write the JSON results (default bench-results/overhead.json)")
    args = p.parse_args(argv)
    levels = [int(x) for x in args.concurrency.split(",") if x.strip()]
    tokens = tuple(int(x) for x in args.tokens.split(",") if x.strip())
    layouts = layouts_for(args.cpus)
    if not layouts:
        p.error("--cpus own-core needs Linux and at least two cores")
    print(f"speclane bench overhead: levels {levels}, streams of {list(tokens)} tokens, "
          f"{args.rounds} x {args.seconds:g}s each, core layouts {list(layouts)}", flush=True)
    result = asyncio.run(run(levels, args.seconds, args.warmup, args.nginx, tokens,
                             max(1, args.rounds), args.cpus))
    print(render_table(result))
    print()
    print(render_targets(result["targets"]))
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
