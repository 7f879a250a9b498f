"""``speclane bench agent``: the command line (the benchmark itself: ``run.py``)."""

from __future__ import annotations

import argparse
import asyncio
from pathlib import Path

from router.bench.agent.report import render
from router.bench.agent.run import run
from router.bench.common.cli import save


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(
        prog="speclane bench agent",
        description="An agent conversation against speclane's batching lane and mlx_lm.server.",
    )
    p.add_argument("--model", help="mlx-lm model directory (default: the prepared default)")
    p.add_argument(
        "--system-tokens",
        type=int,
        default=1000,
        help="approximate size of the system prompt (default 1000)",
    )
    p.add_argument("--turns", type=int, default=3)
    p.add_argument("--max-tokens", type=int, default=24, help="per turn (default 24)")
    p.add_argument("--concurrency", type=int, default=4)
    p.add_argument("--concurrent-tokens", type=int, default=24)
    p.add_argument(
        "--rounds",
        type=int,
        default=2,
        help="concurrency rounds per target, alternating (default 2)",
    )
    p.add_argument(
        "--long-tokens",
        type=int,
        default=800,
        help="approximate size of the long prompt of the starvation test",
    )
    p.add_argument("--out", type=Path, default=Path("bench-results/agent.json"))
    args = p.parse_args(argv)
    report = asyncio.run(run(args))
    print(f"\n{render(report)}")
    save(args.out, report)
    return 0
