"""``speclane bench``: the speculative readiness scorecard's command line.

Ctrl-C while measuring stops after the requests in flight are cut short and still writes
what was measured; a second Ctrl-C (or one before measuring starts) exits at once.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import signal
import sys
from pathlib import Path

from router.bench.common.cli import csv
from router.bench.common.procs import LaneOptions
from router.bench.scorecard import plot, report
from router.bench.scorecard.plan import (
    DEFAULT_BUDGET,
    DEFAULT_SPEC,
    FAMILY_NAMES,
    MIN_MAX_TOKENS,
    QUICK_BUDGET,
    QUICK_SPEC,
    SCENARIO_NAMES,
    MatrixSpec,
)
from router.bench.scorecard.run import BenchError, Options, Phase, run_scorecard
from router.bench.scorecard.score import Thresholds

INTERRUPTED = 130
MATRIX = ("scenarios", "families", "concurrency", "runs", "max_tokens", "long_prompt_chars")
GATES = {  # Thresholds field -> what its flag sets
    "acceptance_floor": "acceptance gate: accepted/drafted at least this",
    "min_speedup": "interactive gate: spec-on decode tok/s over spec-off at least this",
    "ttft_tolerance": "interactive gate: spec-on TTFT at most this fraction above spec-off",
    "throughput_tolerance": "throughput gate: auto at most this fraction below batching at "
    "the target concurrency",
}


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="speclane bench",
        description="Measure speculative decoding against plain decoding and batching through "
        "speclane's lanes, and write a readiness scorecard (Markdown + JSON).",
        epilog="'speclane bench overhead' measures the proxy's own overhead instead.",
    )
    where = p.add_argument_group("router")
    where.add_argument(
        "--url", help="attach to a running router (its base URL) instead of starting one"
    )
    where.add_argument(
        "--model",
        help="target model for the lanes the bench starts (default: the embedded default model)",
    )
    where.add_argument("--draft-model", help="draft model for the speculative lane")
    where.add_argument("--num-draft-tokens", type=int, help="draft tokens per round")
    where.add_argument("--model-name", help="model id to request (default: the lanes' model)")
    where.add_argument("--api-key", help="API key for a router that requires one")
    m = p.add_argument_group("matrix")
    q = QUICK_SPEC
    m.add_argument(
        "--quick",
        action="store_true",
        help=f"a short run: asks for {' + '.join(q.families)} at concurrency "
        f"{' and '.join(map(str, q.concurrency))}, {q.max_tokens} tokens, within a "
        f"{QUICK_BUDGET:.0f}s budget; on a slow or busy machine the budget cuts it "
        f"further (down to {q.families[0]} at concurrency {q.concurrency[0]}, "
        "1 request; the scorecard lists every cut; --budget 0: no cuts)",
    )
    m.add_argument(
        "--scenarios", type=csv(str, SCENARIO_NAMES), help=f"default: {','.join(SCENARIO_NAMES)}"
    )
    m.add_argument(
        "--families", type=csv(str, FAMILY_NAMES), help=f"default: {','.join(FAMILY_NAMES)}"
    )
    m.add_argument(
        "--concurrency",
        type=csv(int),
        help=f"levels asked for (default {','.join(map(str, DEFAULT_SPEC.concurrency))}"
        f"; quick {','.join(map(str, q.concurrency))}); the budget drops the "
        "highest levels that do not fit unless given here",
    )
    m.add_argument(
        "--runs", type=int, help=f"requests per client loop per cell (default {DEFAULT_SPEC.runs})"
    )
    m.add_argument(
        "--max-tokens",
        type=int,
        help=f"default {DEFAULT_SPEC.max_tokens}; "
        f"keep it above the router's short-output rule (16)",
    )
    m.add_argument(
        "--long-prompt-chars", type=int, help=f"default {DEFAULT_SPEC.long_prompt_chars}"
    )
    m.add_argument(
        "--budget",
        type=float,
        help="seconds of measurement to fit the matrix "
        f"into (default {DEFAULT_BUDGET:.0f}, quick {QUICK_BUDGET:.0f}; 0: the "
        "whole matrix whatever it takes)",
    )
    m.add_argument("--warmup", type=int, default=1, help="warm-up rounds (default 1)")
    m.add_argument(
        "--request-timeout",
        type=float,
        default=600.0,
        help="seconds before one request counts as failed (default 600)",
    )
    g = p.add_argument_group("gates")
    g.add_argument(
        "--target-concurrency",
        type=int,
        help="the level of the throughput gate (default: the highest measured)",
    )
    for name, text in GATES.items():
        default = getattr(Thresholds, name)
        g.add_argument(
            f"--{name.replace('_', '-')}",
            type=float,
            default=default,
            help=f"{text} (default {default})",
        )
    o = p.add_argument_group("output")
    o.add_argument(
        "--out",
        type=Path,
        default=Path("speclane-scorecard"),
        help="output directory (default ./speclane-scorecard)",
    )
    o.add_argument("--plot", action="store_true", help="also write PNG charts (matplotlib)")
    o.add_argument("--no-progress", action="store_true", help="no progress line")
    o.add_argument("--note", help="a remark for the scorecard's environment section")
    o.add_argument(
        "--render",
        type=Path,
        metavar="JSON",
        help="re-render scorecard.md (and charts) from a scorecard.json",
    )
    return p


def options(args: argparse.Namespace) -> Options:
    given = {k: getattr(args, k) for k in MATRIX if getattr(args, k) is not None}
    spec = MatrixSpec(**{**(QUICK_SPEC if args.quick else DEFAULT_SPEC).__dict__, **given})
    budget = (
        args.budget if args.budget is not None else (QUICK_BUDGET if args.quick else DEFAULT_BUDGET)
    )
    thresholds = Thresholds(
        target_concurrency=args.target_concurrency, **{name: getattr(args, name) for name in GATES}
    )
    lanes = LaneOptions(
        args.model,
        args.draft_model,
        args.num_draft_tokens,
        max_batch_size=max(8, *spec.concurrency),
    )
    return Options(
        spec=spec,
        out_dir=args.out,
        fixed=frozenset(given),
        thresholds=thresholds,
        url=args.url,
        model_name=args.model_name,
        lanes=lanes,
        api_key=args.api_key,
        budget=budget,
        warmup=args.warmup,
        plot=args.plot,
        progress=not args.no_progress,
        request_timeout=args.request_timeout,
        note=args.note,
    )


def main(argv: list[str]) -> int:
    p = parser()
    args = p.parse_args(argv)
    if args.render:
        return render(args.render, args.plot)
    try:
        opts = options(args)
    except ValueError as e:
        p.error(str(e))
    if opts.spec.max_tokens < MIN_MAX_TOKENS:
        print(
            f"note: --max-tokens {opts.spec.max_tokens} is at or below the router's "
            "short-output rule: `auto` will send everything to batching",
            file=sys.stderr,
        )
    if opts.plot and not plot.available():
        print(f"speclane bench: {plot.MISSING}", file=sys.stderr)
        return 2
    return asyncio.run(_main(opts))


async def _main(opts: Options) -> int:
    stop, phase = asyncio.Event(), Phase()
    task = asyncio.current_task()
    assert task is not None
    loop = asyncio.get_running_loop()

    def interrupt() -> None:
        if phase.measuring and not stop.is_set():
            print(
                "\nstopping: writing what was measured (Ctrl-C again to quit at once)",
                file=sys.stderr,
                flush=True,
            )
            stop.set()
        else:
            task.cancel()

    loop.add_signal_handler(signal.SIGINT, interrupt)
    try:
        outcome = await run_scorecard(opts, stop, log=_log, phase=phase)
    except BenchError as e:
        print(f"speclane bench: {e}", file=sys.stderr)
        return 1
    except asyncio.CancelledError:
        print("speclane bench: interrupted; nothing written", file=sys.stderr)
        return INTERRUPTED
    finally:
        loop.remove_signal_handler(signal.SIGINT)
    ev = outcome.result.evaluation()
    print(f"\n{ev.verdict}  (readiness score {ev.score}/100)\n{ev.recommendation}")
    for name, path in outcome.paths.items():
        print(f"  {name}: {path}")
    return INTERRUPTED if stop.is_set() else 0


def render(path: Path, with_plot: bool) -> int:
    try:
        result = report.from_json(json.loads(path.read_text(encoding="utf-8")))
    except (OSError, ValueError, KeyError, TypeError) as e:
        print(f"speclane bench: cannot read {path}: {e}", file=sys.stderr)
        return 1
    charts = [name for name in report.CHARTS if (path.parent / name).exists()]
    if with_plot:
        try:
            charts = plot.write_charts(result, result.evaluation(), path.parent)
        except plot.PlotUnavailable as e:
            print(f"speclane bench: {e}", file=sys.stderr)
            return 2
    print(f"  markdown: {report.write(result, path.parent, charts)['markdown']}")
    return 0


def _log(text: str) -> None:
    print(text, file=sys.stderr, flush=True)
