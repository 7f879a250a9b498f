"""``speclane bench lanes``: the command line (the benchmark itself: ``run.py``)."""

from __future__ import annotations

import argparse
import asyncio
import json
from pathlib import Path

from router.bench.lanes.report import TARGETS, render
from router.bench.lanes.run import run


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(
        prog="speclane bench lanes",
        description="The shared and separate lane layouts against mlx_lm.server --draft-model.",
    )
    p.add_argument("--model", help="mlx-lm model directory (default: the prepared default)")
    p.add_argument("--draft-model", help="draft directory (default: the prepared default's)")
    p.add_argument("--system-tokens", type=int, default=600)
    p.add_argument("--turns", type=int, default=3)
    p.add_argument("--max-tokens", type=int, default=16, help="per turn (default 16)")
    p.add_argument("--concurrency", type=int, default=4)
    p.add_argument("--concurrent-tokens", type=int, default=24)
    p.add_argument("--interactive-tokens", type=int, default=24)
    p.add_argument(
        "--targets",
        type=lambda s: [t for t in s.split(",") if t],
        default=list(TARGETS),
        help=f"comma-separated, run in this order (default: {','.join(TARGETS)})",
    )
    p.add_argument("--out", type=Path, default=Path("examples/results/lanes-layout.json"))
    args = p.parse_args(argv)
    if unknown := set(args.targets) - set(TARGETS):
        p.error(f"unknown targets: {', '.join(sorted(unknown))}")
    report = asyncio.run(run(args))
    args.out.write_text(json.dumps(report, indent=2) + "\n", encoding="utf-8")
    print()
    print(render(report))
    print(f"\nwritten to {args.out}")
    return 0
