"""``speclane bench overhead``: what the router adds, direct vs through speclane (vs nginx),
against a synthetic upstream that answers instantly, so that what is measured is the proxy.
Compare proxies measured in the same run, never figures from elsewhere."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import itertools
import os
import platform
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import aiohttp

from router import __version__
from router.bench.common import environment, procs
from router.bench.common.stats import percentile, ratio
from router.bench.common.upstream import PLAIN_BODY, stream_body
from router.bench.overhead import cpu
from router.bench.overhead.report import LAYOUTS, added_over_direct, judge_targets

DEFAULT_TOKENS = (7, 256)
JSON = {"Content-Type": "application/json"}
Meters = dict[str, Callable[[], float | None]]  # role -> CPU seconds so far


@dataclass
class Level:
    """One cell (target, core layout, concurrency, stream length), its rounds pooled."""

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

    def summary(self) -> dict[str, object]:
        keys = ("target", "cpus", "concurrency", "tokens", "requests", "errors")
        return {
            **{k: getattr(self, k) for k in keys},
            **{
                f"{name}_p{q}_ms": percentile(values, q)
                for name, values in (("ttft", self.ttft_ms), ("total", self.total_ms))
                for q in (50, 99)
            },
            "chunks_per_s": ratio(self.chunks, self.seconds),
            "plain_requests_per_s": ratio(self.plain_requests, self.plain_seconds),
            "cpu_us_per_stream": {
                role: used / self.requests * 1e6
                for role, used in self.cpu_seconds.items()
                if self.requests
            },
        }


async def _stream_once(session: aiohttp.ClientSession, url: str, body: bytes, level: Level) -> None:
    start, first, chunks = time.perf_counter(), None, 0
    async with session.post(url, data=body, headers=JSON) as resp:
        if resp.status != 200:
            level.errors += 1
            await resp.read()
            return
        async for data in resp.content.iter_any():
            first = first or time.perf_counter()
            chunks += data.count(b"\n\n")
    end = time.perf_counter()
    level.requests, level.chunks = level.requests + 1, level.chunks + chunks
    level.ttft_ms.append(((first or end) - start) * 1000)
    level.total_ms.append((end - start) * 1000)


async def _plain_once(session: aiohttp.ClientSession, url: str, level: Level) -> None:
    async with session.post(url, data=PLAIN_BODY, headers=JSON) as resp:
        await resp.read()
        if resp.status == 200:
            level.plain_requests += 1
        else:
            level.errors += 1


async def _closed_loop(
    concurrency: int, seconds: float, once: Callable[[], Awaitable[None]]
) -> float:
    deadline = time.perf_counter() + seconds

    async def worker() -> None:
        while time.perf_counter() < deadline:
            with contextlib.suppress(aiohttp.ClientError, TimeoutError):
                await once()

    start = time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(concurrency)))
    return time.perf_counter() - start


async def measure(
    level: Level, targets: dict[str, procs.Served], args: argparse.Namespace, plain: bool
) -> Level:
    """One round of a cell, pooled into ``level``: a warm-up, streams for ``--seconds``, then
    (``plain``) non-streaming requests for half as long."""
    url, c = f"{targets[level.target].url}/chat/completions", level.concurrency
    body, meters = stream_body(level.tokens), _meters(targets, level.target)
    connector = aiohttp.TCPConnector(limit=0, force_close=False)
    async with aiohttp.ClientSession(connector=connector) as session:
        warm = Level(level.target, c, level.tokens)
        await _closed_loop(c, args.warmup, lambda: _stream_once(session, url, body, warm))
        before = {role: read() for role, read in meters.items()}
        level.seconds += await _closed_loop(
            c, args.seconds, lambda: _stream_once(session, url, body, level)
        )
        for role, read in meters.items():
            if (now := read()) is not None and (then := before[role]) is not None:
                level.cpu_seconds[role] = level.cpu_seconds.get(role, 0.0) + now - then
        if plain:
            level.plain_seconds += await _closed_loop(
                c, args.seconds / 2, lambda: _plain_once(session, url, level)
            )
    return level


@contextlib.asynccontextmanager
async def _targets(with_nginx: bool) -> AsyncIterator[dict[str, procs.Served]]:
    """The upstream first (as "direct"), then the proxies in front of it."""
    async with procs.bench_upstream() as upstream, contextlib.AsyncExitStack() as stack:
        targets = {"direct": upstream}
        targets["speclane"] = await stack.enter_async_context(procs.speclane_router(upstream.url))
        if with_nginx:
            targets["nginx"] = await stack.enter_async_context(procs.nginx_proxy(upstream.url))
        yield targets


def _meters(targets: dict[str, procs.Served], name: str) -> Meters:
    upstream, proxy = targets["direct"].sid, targets[name].sid
    meters: Meters = {"upstream": lambda: cpu.session_cpu_seconds(upstream)}
    if name != "direct":
        meters["proxy"] = lambda: cpu.session_cpu_seconds(proxy)
    return meters | {"loadgen": time.process_time}  # this process, every thread


def _arrange(layout: str, targets: dict[str, procs.Served], everything: set[int]) -> None:
    """Pin the processes for a layout; ``shared`` undoes an earlier ``own-core``."""
    if not cpu.supported():
        return
    halves = cpu.split(everything) if layout == "own-core" else None
    proxy_cpus, rest = halves or (everything, everything)
    for name, served in targets.items():
        cpu.pin_session(served.sid, rest if name == "direct" else proxy_cpus)
    cpu.pin([os.getpid()], rest)


def layouts_for(choice: str) -> tuple[str, ...]:
    """The layouts ``--cpus`` asks for that this machine can do (own-core: Linux, 2+ cores)."""
    wanted = LAYOUTS if choice == "both" else (choice,)
    can_split = cpu.supported() and cpu.split(cpu.allowed_cpus()) is not None
    return tuple(w for w in wanted if w == "shared" or can_split)


async def run(args: argparse.Namespace) -> dict[str, Any]:
    """Each (stream length, concurrency) cell is measured in ``--rounds`` rounds that visit
    the targets in turn, starting with a different one each round, and the rounds are
    pooled: a burst of someone else's work on a shared machine then lands on every target
    alike instead of on whichever was being measured."""
    with_nginx = args.nginx == "on" or (args.nginx == "auto" and procs.nginx_binary() is not None)
    layouts, rounds, everything = layouts_for(args.cpus), max(1, args.rounds), cpu.allowed_cpus()
    if not layouts:
        raise ValueError("the own-core layout needs Linux and at least two cores")
    print(
        f"speclane bench overhead: levels {list(args.concurrency)}, streams of "
        f"{list(args.tokens)} tokens, {rounds} x {args.seconds:g}s each, core layouts "
        f"{list(layouts)}",
        flush=True,
    )
    rows: list[dict[str, object]] = []
    async with _targets(with_nginx) as targets:
        names = list(targets)
        try:
            for layout in layouts:
                _arrange(layout, targets, everything)
                for (n, length), c in itertools.product(enumerate(args.tokens), args.concurrency):
                    pooled = {name: Level(name, c, length, layout) for name in names}
                    for r in range(rounds):
                        for name in names[r % len(names) :] + names[: r % len(names)]:
                            # Non-streaming requests/s does not depend on the stream length.
                            await measure(pooled[name], targets, args, plain=n == 0)
                    rows += [level.summary() for level in pooled.values()]
                    streams = ", ".join(f"{k} {v.requests}" for k, v in pooled.items())
                    print(f"  {layout} c={c} {length} tokens: streams {streams}", flush=True)
        finally:
            if cpu.supported() and everything:
                cpu.pin([os.getpid()], everything)  # a caller in this process keeps its cores
    machine = {"platform": platform.platform(), "python": platform.python_version()}
    result: dict[str, Any] = {
        "benchmark": "overhead",
        "speclane": __version__,
        "date": environment.now_iso(),
        "machine": {**machine, "cpus": os.cpu_count() or 0},
        "seconds_per_level": args.seconds,
        "rounds": rounds,
        "nginx": with_nginx,
        "tokens": list(args.tokens),
        "layouts": list(layouts),
        "rows": rows,
        "added": added_over_direct(rows),
    }
    return result | {"targets": judge_targets(result)}
