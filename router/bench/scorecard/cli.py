"""``speclane bench``: the speculative readiness scorecard.

    speclane bench                      # start a router with both lanes, measure, report
    speclane bench --quick --plot       # the short version, with charts
    speclane bench --url http://127.0.0.1:8080/v1   # measure a router already running
    speclane bench --render out/scorecard.json      # re-render a scorecard from its JSON

Ctrl-C while measuring stops after the requests in flight are cut short and still writes
what was measured; a second Ctrl-C (or one before measuring starts) exits at once.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import signal
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from router.bench.common.procs import LaneOptions
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


def _csv(kind: type, choices: tuple[str, ...] | None = None) -> Callable[[str], tuple[Any, ...]]:
    def parse(text: str) -> tuple[Any, ...]:
        try:
            values = tuple(kind(v.strip()) for v in text.split(",") if v.strip())
        except ValueError as e:
            raise argparse.ArgumentTypeError(f"not a comma-separated list: {text!r}") from e
        if not values:
            raise argparse.ArgumentTypeError("empty list")
        if choices:
            bad = [v for v in values if v not in choices]
            if bad:
                raise argparse.ArgumentTypeError(
                    f"unknown: {', '.join(bad)} (choose from {', '.join(choices)})")
        return values

    return parse


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="speclane bench",
        description="Measure speculative decoding against plain decoding and batching through "
                    "speclane's lanes, and write a readiness scorecard (Markdown + JSON).",
        epilog="'speclane bench overhead' measures the proxy's own overhead instead.")
    where = p.add_argument_group("router")
    where.add_argument("--url", help="attach to a running router (its base URL) instead of "
                       "starting one")
    where.add_argument("--model", help="target model for the lanes the bench starts "
                       "(default: the embedded default model)")
    where.add_argument("--draft-model", help="draft model for the speculative lane")
    where.add_argument("--num-draft-tokens", type=int, help="draft tokens per round")
    where.add_argument("--model-name", help="model id to request (default: the lanes' model)")
    where.add_argument("--api-key", help="API key for a router that requires one")
    m = p.add_argument_group("matrix")
    m.add_argument("--quick", action="store_true",
                   help=f"a short run: asks for {' + '.join(QUICK_SPEC.families)} at "
                   f"concurrency {' and '.join(map(str, QUICK_SPEC.concurrency))}, "
                   f"{QUICK_SPEC.max_tokens} tokens, within a {QUICK_BUDGET:.0f}s budget; on a "
                   "slow or busy machine the budget cuts it further (down to "
                   f"{QUICK_SPEC.families[0]} at concurrency {QUICK_SPEC.concurrency[0]}, "
                   "1 request; the scorecard lists every cut; --budget 0: no cuts)")
    m.add_argument("--scenarios", type=_csv(str, SCENARIO_NAMES),
                   help=f"default: {','.join(SCENARIO_NAMES)}")
    m.add_argument("--families", type=_csv(str, FAMILY_NAMES),
                   help=f"default: {','.join(FAMILY_NAMES)}")
    m.add_argument("--concurrency", type=_csv(int),
                   help=f"levels asked for (default {','.join(map(str, DEFAULT_SPEC.concurrency))}"
                   f"; quick {','.join(map(str, QUICK_SPEC.concurrency))}); the budget drops the "
                   "highest levels that do not fit unless given here")
    m.add_argument("--runs", type=int, help="requests per client loop per cell "
                   f"(default {DEFAULT_SPEC.runs})")
    m.add_argument("--max-tokens", type=int, help=f"default {DEFAULT_SPEC.max_tokens}; "
                   f"keep it above the router's short-output rule (16)")
    m.add_argument("--long-prompt-chars", type=int,
                   help=f"default {DEFAULT_SPEC.long_prompt_chars}")
    m.add_argument("--budget", type=float, help="seconds of measurement to fit the matrix "
                   f"into (default {DEFAULT_BUDGET:.0f}, quick {QUICK_BUDGET:.0f}; 0: the "
                   "whole matrix whatever it takes)")
    m.add_argument("--warmup", type=int, default=1, help="warm-up rounds (default 1)")
    m.add_argument("--request-timeout", type=float, default=600.0,
                   help="seconds before one request counts as failed (default 600)")
    g = p.add_argument_group("gates")
    g.add_argument("--target-concurrency", type=int,
                   help="the level of the throughput gate (default: the highest measured)")
    g.add_argument("--acceptance-floor", type=float, default=Thresholds.acceptance_floor,
                   help="acceptance gate: accepted/drafted at least this "
                   f"(default {Thresholds.acceptance_floor})")
    g.add_argument("--min-speedup", type=float, default=Thresholds.min_speedup,
                   help="interactive gate: spec-on decode tok/s over spec-off at least this "
                   f"(default {Thresholds.min_speedup})")
    g.add_argument("--ttft-tolerance", type=float, default=Thresholds.ttft_tolerance,
                   help="interactive gate: spec-on TTFT at most this fraction above spec-off "
                   f"(default {Thresholds.ttft_tolerance})")
    g.add_argument("--throughput-tolerance", type=float,
                   default=Thresholds.throughput_tolerance,
                   help="throughput gate: auto at most this fraction below batching at the "
                   f"target concurrency (default {Thresholds.throughput_tolerance})")
    o = p.add_argument_group("output")
    o.add_argument("--out", type=Path, default=Path("speclane-scorecard"),
                   help="output directory (default ./speclane-scorecard)")
    o.add_argument("--plot", action="store_true", help="also write PNG charts (matplotlib)")
    o.add_argument("--no-progress", action="store_true", help="no progress line")
    o.add_argument("--note", help="a remark for the scorecard's environment section")
    o.add_argument("--render", type=Path, metavar="JSON",
                   help="re-render scorecard.md (and charts) from a scorecard.json")
    return p


def options(args: argparse.Namespace) -> Options:
    base = QUICK_SPEC if args.quick else DEFAULT_SPEC
    given = {"scenarios": args.scenarios, "families": args.families,
             "concurrency": args.concurrency, "runs": args.runs,
             "max_tokens": args.max_tokens, "long_prompt_chars": args.long_prompt_chars}
    given = {k: v for k, v in given.items() if v is not None}
    spec = MatrixSpec(**{**base.__dict__, **given})
    budget = args.budget if args.budget is not None else (
        QUICK_BUDGET if args.quick else DEFAULT_BUDGET)
    thresholds = Thresholds(
        min_speedup=args.min_speedup, ttft_tolerance=args.ttft_tolerance,
        throughput_tolerance=args.throughput_tolerance,
        acceptance_floor=args.acceptance_floor, target_concurrency=args.target_concurrency)
    lanes = LaneOptions(args.model, args.draft_model, args.num_draft_tokens,
                        max_batch_size=max(8, *spec.concurrency))
    return Options(spec=spec, out_dir=args.out, fixed=frozenset(given), thresholds=thresholds,
                   url=args.url, model_name=args.model_name, lanes=lanes, api_key=args.api_key,
                   budget=budget, warmup=args.warmup, plot=args.plot,
                   progress=not args.no_progress, request_timeout=args.request_timeout,
                   note=args.note)


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
        print(f"note: --max-tokens {opts.spec.max_tokens} is at or below the router's "
              "short-output rule: `auto` will send everything to batching", file=sys.stderr)
    if opts.plot:
        from router.bench.scorecard import plot

        if not plot.available():
            print(f"speclane bench: {plot.MISSING}", file=sys.stderr)
            return 2
    return asyncio.run(_main(opts))


async def _main(opts: Options) -> int:
    stop = asyncio.Event()
    phase = Phase()
    task = asyncio.current_task()
    assert task is not None
    loop = asyncio.get_running_loop()

    def interrupt() -> None:
        if phase.measuring and not stop.is_set():
            print("\nstopping: writing what was measured (Ctrl-C again to quit at once)",
                  file=sys.stderr, flush=True)
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


def render(path: Path, plot: bool) -> int:
    from router.bench.scorecard import report

    try:
        result = report.from_json(json.loads(path.read_text(encoding="utf-8")))
    except (OSError, ValueError, KeyError, TypeError) as e:
        print(f"speclane bench: cannot read {path}: {e}", file=sys.stderr)
        return 1
    out_dir = path.parent
    charts = [name for name in report.CHARTS if (out_dir / name).exists()]
    if plot:
        from router.bench.scorecard import plot as plots

        try:
            charts = plots.write_charts(result, result.evaluation(), out_dir)
        except plots.PlotUnavailable as e:
            print(f"speclane bench: {e}", file=sys.stderr)
            return 2
    paths = report.write(result, out_dir, charts)
    print(f"  markdown: {paths['markdown']}")
    return 0


def _log(text: str) -> None:
    print(text, file=sys.stderr, flush=True)
