"""``speclane bench overhead``: the command line (the benchmark itself: ``run.py``)."""

from __future__ import annotations

import argparse
import asyncio
from pathlib import Path

from router.bench.common.cli import csv, save
from router.bench.overhead.report import render_table, render_targets
from router.bench.overhead.run import DEFAULT_TOKENS, layouts_for, run


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(
        prog="speclane bench overhead",
        description="Measure the latency and throughput speclane adds.",
    )
    p.add_argument(
        "--concurrency",
        type=csv(int),
        default=(1, 16, 64),
        help="comma-separated (default 1,16,64)",
    )
    p.add_argument(
        "--tokens",
        type=csv(int),
        default=DEFAULT_TOKENS,
        help="comma-separated stream lengths in tokens (default 7,256)",
    )
    p.add_argument(
        "--seconds",
        type=float,
        default=3.0,
        help="measured seconds per target, level and round (default 3)",
    )
    p.add_argument(
        "--rounds", type=int, default=3, help="interleaved rounds pooled per level (default 3)"
    )
    p.add_argument(
        "--warmup",
        type=float,
        default=0.5,
        help="warm-up seconds before each measurement (default 0.5)",
    )
    p.add_argument(
        "--nginx",
        choices=("auto", "on", "off"),
        default="auto",
        help="also measure nginx as a plain reverse proxy (auto: when installed)",
    )
    p.add_argument(
        "--cpus",
        choices=("shared", "own-core", "both"),
        default="both",
        help="core layout: every process shares every core, the proxies get a "
        "core of their own (Linux, 2+ cores), or both in turn (default both; "
        "own-core is skipped where it cannot be done)",
    )
    p.add_argument(
        "--out",
        type=Path,
        default=Path("bench-results/overhead.json"),
        help="where to write the JSON results (default bench-results/overhead.json)",
    )
    args = p.parse_args(argv)
    layouts = layouts_for(args.cpus)
    if not layouts:
        p.error("--cpus own-core needs Linux and at least two cores")
    print(
        f"speclane bench overhead: levels {list(args.concurrency)}, streams of "
        f"{list(args.tokens)} tokens, {args.rounds} x {args.seconds:g}s each, core layouts "
        f"{list(layouts)}",
        flush=True,
    )
    result = asyncio.run(
        run(
            list(args.concurrency),
            args.seconds,
            args.warmup,
            args.nginx,
            args.tokens,
            max(1, args.rounds),
            args.cpus,
        )
    )
    print(f"{render_table(result)}\n\n{render_targets(result['targets'])}")  # type: ignore[arg-type]
    save(args.out, result)
    return 0
