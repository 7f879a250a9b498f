"""256 concurrent streaming clients through ``speclane serve``: nothing lost or duplicated.

Loopback only and bounded (10 rounds of 256 streams, a hard time limit). The router is a
subprocess so its memory is its own: its RSS is sampled throughout and its peak reported.
Every request carries a unique id; the checks are end to end:

- each client gets exactly one answer: a complete stream (every event whole JSON, the
  content all there, ``[DONE]``), or a clean error; a stream cut short or a connection
  dropped without an answer counts as *lost*;
- each id reaches an upstream exactly once (a retry that doubles work counts as duplicated);
- afterwards ``speclane_inflight_requests`` and ``speclane_queue_depth`` are back to zero;
- the router's RSS stays bounded and does not grow from round to round.
"""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from pathlib import Path

import aiohttp
import orjson

from tests.conftest import fake_upstreams
from tests.fakes.upstream import Behaviour
from tests.reliability.harness import (
    TALLY,
    RouterProcess,
    StreamResult,
    config_text,
    eventually,
    metric_total,
    sse_payloads,
)

CLIENTS = 256
ROUNDS = 10
CHUNKS = 8
TIME_LIMIT = 150.0  # seconds for all rounds, on a loaded 2-core machine


async def one_client(s: aiohttp.ClientSession, url: str, rid: str) -> str:
    """'complete', 'error' (a clean error answer) or 'lost'."""
    body = {
        "model": "fake-model",
        "messages": [{"role": "user", "content": rid}],
        "stream": True,
        "user": rid,
    }
    try:
        async with s.post(url, json=body) as resp:
            raw = bytearray()
            try:
                async for piece in resp.content.iter_any():
                    raw += piece
            except aiohttp.ClientPayloadError:
                return "lost"  # cut short without an ending
            res = StreamResult(resp.status, dict(resp.headers), bytes(raw), True)
    except (aiohttp.ClientError, TimeoutError):
        return "lost"  # no answer at all
    if res.status != 200:
        return "error" if "error" in orjson.loads(res.raw) else "lost"
    if res.error_event() is not None:
        return "error"
    events = sse_payloads(res.raw)
    if not res.completed():
        return "lost"
    text = "".join(
        c["choices"][0]["delta"].get("content", "")
        for c in map(orjson.loads, events[:-1])
        if c["choices"]
    )
    return "complete" if text == "".join(f"w{i} " for i in range(CHUNKS)) else "lost"


async def sample_rss(router: RouterProcess, peaks: list[int], stop: asyncio.Event) -> None:
    proc = router.ps
    while not stop.is_set():
        peaks[-1] = max(peaks[-1], proc.memory_info().rss)
        try:
            await asyncio.wait_for(stop.wait(), 0.05)
        except TimeoutError:
            pass


async def test_256_concurrent_streams_lose_nothing(tmp_path: Path) -> None:
    async with fake_upstreams("up1", "up2") as fakes:
        for f in fakes:
            f.behaviour = Behaviour(chunks=CHUNKS)
        (tmp_path / "policies").mkdir()
        config = tmp_path / "speclane.toml"
        config.write_text(
            config_text(
                policies_dir=str(tmp_path / "policies"),
                log_level="warning",
                health_interval=600,
                backends=[
                    {"name": f.name, "base_url": f.base_url, "read_timeout": 60} for f in fakes
                ],
            )
        )
        router = await RouterProcess.start(config, "--no-lanes")
        try:
            url = f"{router.base_url}/chat/completions"
            connector = aiohttp.TCPConnector(limit=0, force_close=False)
            timeout = aiohttp.ClientTimeout(total=TIME_LIMIT)
            async with aiohttp.ClientSession(connector=connector, timeout=timeout) as s:
                await one_client(s, url, "warm-up")
                baseline = router.ps.memory_info().rss
                peaks = [baseline]
                verdicts: Counter[str] = Counter()
                stop = asyncio.Event()
                sampler = asyncio.create_task(sample_rss(router, peaks, stop))
                started = time.monotonic()
                async with asyncio.timeout(TIME_LIMIT):
                    for rnd in range(ROUNDS):
                        peaks.append(router.ps.memory_info().rss)
                        verdicts.update(
                            await asyncio.gather(
                                *(one_client(s, url, f"r{rnd}-c{i}") for i in range(CLIENTS))
                            )
                        )
                elapsed = time.monotonic() - started
                stop.set()
                await sampler

                async def drained() -> bool:
                    return (
                        await metric_total(s, router.url, "speclane_inflight_requests") == 0
                        and await metric_total(s, router.url, "speclane_queue_depth") == 0
                    )

                await eventually(drained, what="in-flight gauges at zero")
            seen = Counter(q.body.get("user") for f in fakes for q in f.requests)
        finally:
            code = await router.stop()
    total = CLIENTS * ROUNDS
    ids = {f"r{r}-c{i}" for r in range(ROUNDS) for i in range(CLIENTS)}
    duplicated = sum(1 for rid in ids if seen[rid] > 1)
    never_sent = sum(1 for rid in ids if seen[rid] == 0)
    mib = 2**20
    peak = max(peaks)
    TALLY.load.update(
        requests=total,
        concurrency=CLIENTS,
        rounds=ROUNDS,
        complete=verdicts["complete"],
        errors=verdicts["error"],
        lost=verdicts["lost"],
        duplicated=duplicated,
        seconds=round(elapsed, 1),
        streams_per_s=round(total / elapsed),
        router_rss_baseline_mb=round(baseline / mib, 1),
        router_peak_rss_mb=round(peak / mib, 1),
        peak_per_round_mb=[round(p / mib, 1) for p in peaks[1:]],
        inflight_after=0,
    )
    assert verdicts["lost"] == 0 and duplicated == 0 and never_sent == 0, TALLY.load
    assert verdicts["complete"] == total, verdicts  # fast healthy fakes: no error either
    assert sum(seen.values()) == total + 1  # and the warm-up
    assert code == 0
    # Bounded memory: well under what 768 buffered streams would take, and no growth
    # from the first round to the last beyond allocator noise.
    assert peak - baseline < 150 * mib, (baseline, peak)
    assert peaks[-1] - peaks[1] < 40 * mib, peaks
