"""``speclane bench cold``: the command line (the benchmark itself: ``run.py``)."""

from __future__ import annotations

import argparse
import asyncio
from pathlib import Path

from router.bench.cold.plan import MODES
from router.bench.cold.report import markdown, table
from router.bench.cold.run import models_dir_supported, run
from router.bench.common.cli import save


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(
        prog="speclane bench cold",
        description="Time to first token of a cold request (load included): speclane against "
        "mlx_lm.server started fresh on the same model, rounds interleaved.",
    )
    p.add_argument("--model", help="mlx-lm model directory (default: the prepared default)")
    p.add_argument(
        "--mode",
        choices=("auto", *MODES),
        default="auto",
        help="on-demand: an unloaded model of [lanes] models_dir; startup: speclane serve's "
        "start to first token; auto (default): on-demand when this router has models_dir",
    )
    p.add_argument("--rounds", type=int, default=3, help="rounds of both sides (default 3)")
    p.add_argument("--warm", type=int, default=3, help="warm requests per side and round")
    p.add_argument("--max-tokens", type=int, default=8, help="per request (default 8)")
    p.add_argument("--layout", choices=("auto", "shared", "separate"), default="auto")
    p.add_argument("--out", type=Path, default=Path("examples/results/cold-start.json"))
    args = p.parse_args(argv)
    if args.rounds < 1 or args.warm < 0 or args.max_tokens < 1:
        p.error("--rounds and --max-tokens must be at least 1, --warm at least 0")
    if args.mode == "on-demand" and not models_dir_supported():
        p.error(
            "--mode on-demand needs [lanes] models_dir, which this router lacks (--mode startup)"
        )
    report = asyncio.run(run(args))
    print()
    print(table(report))
    save(args.out, report)
    md = args.out.with_suffix(".md")
    md.write_text(markdown(report), encoding="utf-8")
    print(f"saved {md}")
    return 0
