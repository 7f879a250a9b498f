"""``speclane bench [overhead | agent | lanes | cold | prefill ...] ...``: every benchmark's
flags, parsed here; the benchmarks (``router/bench/``) take the parsed namespace and return
their results. ``speclane bench`` (the scorecard): a first Ctrl-C while measuring cuts the
requests in flight short and still writes what was measured; a second one (or one before
measuring) exits."""

from __future__ import annotations

import argparse
import asyncio
import json
import signal
import sys
from collections.abc import Callable, Coroutine, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any, NamedTuple

from router.bench.agent import report as agent_report
from router.bench.agent import run as agent_run
from router.bench.cold import plan as cold_plan
from router.bench.cold import report as cold_report
from router.bench.cold import run as cold_run
from router.bench.common.procs import LaneOptions
from router.bench.distributed import report as distributed_report
from router.bench.distributed import run as distributed_run
from router.bench.lanes import report as lanes_report
from router.bench.lanes import run as lanes_run
from router.bench.overhead import report as overhead_report
from router.bench.overhead import run as overhead_run
from router.bench.prefill import plan as prefill_plan
from router.bench.prefill import report as prefill_report
from router.bench.prefill import run as prefill_run
from router.bench.prefill import shapes as prefill_shapes
from router.bench.scorecard import plan, plot, report
from router.bench.scorecard.run import BenchError, Options, run_scorecard
from router.bench.scorecard.score import Thresholds
from router.bench.session import report as session_report
from router.bench.session import run as session_run
from router.bench.session.script import SESSIONS

INTERRUPTED = 130


def csv(
    kind: Callable[[str], Any], choices: Sequence[str] = ()
) -> Callable[[str], tuple[Any, ...]]:
    """An argparse ``type``: a non-empty comma-separated list of ``kind`` (among ``choices``)."""

    def parse(text: str) -> tuple[Any, ...]:
        try:
            values = tuple(kind(v.strip()) for v in text.split(",") if v.strip())
        except ValueError as e:
            raise argparse.ArgumentTypeError(f"not a comma-separated list: {text!r}") from e
        if not values:
            raise argparse.ArgumentTypeError("empty list")
        if bad := [v for v in values if choices and v not in choices]:
            raise argparse.ArgumentTypeError(
                f"unknown: {', '.join(bad)} (choose from {', '.join(choices)})"
            )
        return values

    return parse


def save(path: Path, results: object) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(results, indent=2) + "\n", encoding="utf-8")
    print(f"\nsaved {path}")


def flags(p: Any, *specs: tuple[Any, ...]) -> None:
    """``(flag, default, help, **argparse keywords)`` rows; a non-None default shows in the
    help, and sets the ``type`` unless the row gives one."""
    for flag, default, text, *extra in specs:
        kw: dict[str, Any] = extra[0] if extra else {}
        if default is not None and not isinstance(default, bool | tuple):
            kw.setdefault("type", type(default))
        shown = ",".join(map(str, default)) if isinstance(default, tuple) else default
        shown = f"{shown:g}" if isinstance(shown, float) else shown
        if default not in (None, False) and "default" not in (text or ""):
            text = f"{text} (default {shown})" if text else f"default {shown}"
        p.add_argument(flag, default=default, help=text, **kw)


class Bench(NamedTuple):
    description: str
    flags: tuple[tuple[Any, ...], ...]  # flags() rows
    run: Callable[[argparse.Namespace], Coroutine[Any, Any, dict[str, Any]]]
    render: Callable[[dict[str, Any]], str]  # what to print of the results
    check: Callable[[argparse.Namespace], str | None] = lambda args: None  # a usage error
    markdown: Callable[[dict[str, Any]], str] | None = None  # a Markdown beside the JSON


def main(argv: list[str]) -> int:
    if not argv or argv[0] not in BENCHES:
        return scorecard(argv)
    name, bench = argv[0], BENCHES[argv[0]]
    p = argparse.ArgumentParser(prog=f"speclane bench {name}", description=bench.description)
    flags(p, *bench.flags)
    args = p.parse_args(argv[1:])
    if problem := bench.check(args):
        p.error(problem)
    # Comma-separated lists as lists, as the results record them.
    vars(args).update({k: list(v) for k, v in vars(args).items() if isinstance(v, tuple)})
    results = asyncio.run(bench.run(args))
    print(f"\n{bench.render(results)}")
    save(args.out, results)
    if bench.markdown is not None:
        args.out.with_suffix(".md").write_text(bench.markdown(results), encoding="utf-8")
        print(f"saved {args.out.with_suffix('.md')}")
    return 0


def _layouts(args: argparse.Namespace) -> str | None:
    if not overhead_run.layouts_for(args.cpus):
        return "--cpus own-core needs Linux and at least two cores"
    return None


def _counts(args: argparse.Namespace) -> str | None:
    if args.rounds < 1 or args.warm < 0 or args.max_tokens < 1:
        return "--rounds and --max-tokens must be at least 1, --warm at least 0"
    return None


MODEL = ("--model", None, "mlx-lm model directory (default: the prepared default)")
LANES = lanes_report.TARGETS
BENCHES = {
    "overhead": Bench(
        "Measure the latency and throughput speclane adds.",
        (
            ("--concurrency", (1, 16, 64), "comma-separated", {"type": csv(int)}),
            ("--tokens", overhead_run.DEFAULT_TOKENS, "comma-separated stream lengths in tokens",
             {"type": csv(int)}),
            ("--seconds", 3.0, "measured seconds per target, level and round"),
            ("--rounds", 3, "interleaved rounds pooled per level"),
            ("--warmup", 0.5, "warm-up seconds before each measurement"),
            ("--nginx", "auto", "also measure nginx as a plain reverse proxy (auto: when "
             "installed)", {"choices": ("auto", "on", "off")}),
            ("--cpus", "both", "core layout: every process shares every core, the proxies get "
             "a core of their own (Linux, 2+ cores), or both in turn (default both; own-core "
             "is skipped where it cannot be done)", {"choices": ("shared", "own-core", "both")}),
            ("--out", Path("bench-results/overhead.json"), "where to write the JSON results"),
        ),
        overhead_run.run, overhead_report.render, _layouts,
    ),
    "agent": Bench(
        "An agent conversation against speclane's batching lane and mlx_lm.server.",
        (
            MODEL,
            ("--system-tokens", 1000, "approximate size of the system prompt"),
            ("--turns", 3, None),
            ("--max-tokens", 24, "per turn"),
            ("--concurrency", 4, None),
            ("--concurrent-tokens", 24, None),
            ("--rounds", 2, "concurrency rounds per target, alternating"),
            ("--long-tokens", 800, "approximate size of the long prompt of the starvation test"),
            ("--out", Path("bench-results/agent.json"), None),
        ),
        agent_run.run, agent_report.render,
    ),
    "session": Bench(
        "Agents' editing sessions (whole file, search/replace, diff, a question, a retry; "
        "chat) against mlx_lm.server, mlx_lm.server --draft-model and speclane, the last "
        "with its own choice of draft and with each source fixed.",
        (
            MODEL,
            ("--draft-model", None, "draft directory (default: the prepared default's)"),
            ("--sessions", tuple(SESSIONS), "comma-separated", {"type": csv(str, tuple(SESSIONS))}),
            ("--targets", session_run.TARGETS, "comma-separated",
             {"type": csv(str, session_run.CHOICES)}),
            ("--max-tokens", 300, "per turn"),
            ("--num-draft-tokens", 3, "mlx_lm.server --draft-model's"),
            ("--agents", 1, "copies of each session at once, each its own file (makespan)"),
            ("--out", Path("bench-results/session.json"), None),
        ),
        session_run.run, session_report.render,
    ),
    "lanes": Bench(
        "The shared and separate lane layouts against mlx_lm.server --draft-model.",
        (
            MODEL,
            ("--draft-model", None, "draft directory (default: the prepared default's)"),
            ("--system-tokens", 600, None),
            ("--turns", 3, None),
            ("--max-tokens", 16, "per turn"),
            ("--concurrency", 4, None),
            ("--concurrent-tokens", 24, None),
            ("--interactive-tokens", 24, None),
            ("--targets", LANES, "comma-separated, run in this order", {"type": csv(str, LANES)}),
            ("--out", Path("examples/results/lanes-layout.json"), None),
        ),
        lanes_run.run, lanes_report.render,
    ),
    "cold": Bench(
        "Time to first token of a cold request (load included): speclane against "
        "mlx_lm.server started fresh on the same model, rounds interleaved.",
        (
            MODEL,
            ("--mode", "auto", "on-demand: an unloaded model of [lanes] models_dir; startup: "
             "speclane serve's start to first token; auto: on-demand",
             {"choices": ("auto", *cold_plan.MODES)}),
            ("--rounds", 3, "rounds of both sides"),
            ("--warm", 3, "warm requests per side and round"),
            ("--max-tokens", 8, "per request"),
            ("--layout", "auto", None, {"choices": ("auto", "shared", "separate")}),
            ("--out", Path("examples/results/cold-start.json"), None),
        ),
        cold_run.run, cold_report.table, _counts, cold_report.markdown,
    ),
    "prefill": Bench(
        "What an agent's turns prefill, on the real programs' request bodies (Claude Code's "
        "sessions, compaction and sub-agents, Qwen Code's tool loop, Codex), a restart and "
        "an unload in the middle: speclane's lanes (with the prompt cache's disk tier) "
        "against mlx_lm.server.",
        (
            MODEL,
            ("--fixtures", prefill_shapes.FIXTURES, "the captured request bodies"),
            ("--max-tokens", 8, "per request"),
            ("--targets", prefill_plan.TARGETS, "comma-separated, run in this order",
             {"type": csv(str, prefill_plan.TARGETS)}),
            ("--out", Path("examples/results/prefill.json"), None),
        ),
        prefill_run.run, prefill_report.render, markdown=prefill_report.markdown,
    ),
    "distributed": Bench(
        "One copy-heavy stream on a group of ranks on 127.0.0.1 (mlx.launch --backend ring): "
        "mlx_lm.server's plain distributed decoding against speclane's lane over the same "
        "group, plain, with prompt lookup and with a prediction.",
        (
            MODEL,
            ("--ranks", 3, "ranks, all on 127.0.0.1 (the model's heads must divide by it)"),
            ("--max-tokens", 40, "per stream"),
            ("--repeats", 1, "streams per target"),
            ("--targets", distributed_run.TARGETS, "comma-separated",
             {"type": csv(str, distributed_run.TARGETS)}),
            ("--out", Path("examples/results/distributed.json"), None),
        ),
        distributed_run.run, distributed_report.render, markdown=distributed_report.markdown,
    ),
}  # fmt: skip


# --- speclane bench: the readiness scorecard ---------------------------------------------

MATRIX = ("scenarios", "families", "concurrency", "runs", "max_tokens", "long_prompt_chars")
GATES = {  # Thresholds field -> what its flag sets
    "acceptance_floor": "acceptance gate: accepted/drafted at least this",
    "min_speedup": "interactive gate: spec-on decode tok/s over spec-off at least this",
    "ttft_tolerance": "interactive gate: spec-on TTFT at most this fraction above spec-off",
    "throughput_tolerance": "throughput gate: auto at most this fraction below batching at "
    "the target concurrency",
}


def scorecard_parser() -> argparse.ArgumentParser:
    d, q = plan.DEFAULT_SPEC, plan.QUICK_SPEC
    p = argparse.ArgumentParser(
        prog="speclane bench",
        description="Measure speculative decoding against plain decoding and batching through "
        "speclane's lanes, and write a readiness scorecard (Markdown + JSON).",
        epilog="'speclane bench overhead' measures the proxy's own overhead instead.",
    )
    flags(
        p.add_argument_group("router"),
        ("--url", None, "attach to a running router (its base URL) instead of starting one"),
        ("--model", None, "target model for the lanes the bench starts (default: the "
         "embedded default model)"),
        ("--draft-model", None, "draft model for the speculative lane"),
        ("--num-draft-tokens", None, "draft tokens per round", {"type": int}),
        ("--model-name", None, "model id to request (default: the lanes' model)"),
        ("--api-key", None, "API key for a router that requires one"),
    )  # fmt: skip
    flags(
        p.add_argument_group("matrix"),
        ("--quick", False, f"a short run: asks for {' + '.join(q.families)} at concurrency "
         f"{' and '.join(map(str, q.concurrency))}, {q.max_tokens} tokens, within a "
         f"{plan.QUICK_BUDGET:.0f}s budget; on a slow or busy machine the budget cuts it "
         f"further (down to {q.families[0]} at concurrency {q.concurrency[0]}, 1 request; the "
         "scorecard lists every cut; --budget 0: no cuts)", {"action": "store_true"}),
        ("--scenarios", None, f"default: {','.join(plan.SCENARIO_NAMES)}",
         {"type": csv(str, plan.SCENARIO_NAMES)}),
        ("--families", None, f"default: {','.join(plan.FAMILY_NAMES)}",
         {"type": csv(str, plan.FAMILY_NAMES)}),
        ("--concurrency", None, f"levels asked for (default {','.join(map(str, d.concurrency))}"
         f"; quick {','.join(map(str, q.concurrency))}); the budget drops the highest levels "
         "that do not fit unless given here", {"type": csv(int)}),
        ("--runs", None, f"requests per client loop per cell (default {d.runs})", {"type": int}),
        ("--max-tokens", None, f"default {d.max_tokens}; keep it above the router's "
         "short-output rule (16)", {"type": int}),
        ("--long-prompt-chars", None, f"default {d.long_prompt_chars}", {"type": int}),
        ("--budget", None, "seconds of measurement to fit the matrix into (default "
         f"{plan.DEFAULT_BUDGET:.0f}, quick {plan.QUICK_BUDGET:.0f}; 0: the whole matrix "
         "whatever it takes)", {"type": float}),
        ("--warmup", 1, "warm-up rounds"),
        ("--request-timeout", 600.0, "seconds before one request counts as failed"),
    )  # fmt: skip
    flags(
        p.add_argument_group("gates"),
        ("--target-concurrency", None, "the level of the throughput gate (default: the "
         "highest measured)", {"type": int}),
        *((f"--{name.replace('_', '-')}", getattr(Thresholds, name), text)
          for name, text in GATES.items()),
    )  # fmt: skip
    flags(
        p.add_argument_group("output"),
        ("--out", Path("speclane-scorecard"), "output directory (default ./speclane-scorecard)"),
        ("--plot", False, "also write PNG charts (matplotlib)", {"action": "store_true"}),
        ("--no-progress", False, "no progress line", {"action": "store_true"}),
        ("--note", None, "a remark for the scorecard's environment section"),
        ("--render", None, "re-render scorecard.md (and charts) from a scorecard.json",
         {"type": Path, "metavar": "JSON"}),
    )  # fmt: skip
    return p


def scorecard_options(args: argparse.Namespace) -> Options:
    given = {k: getattr(args, k) for k in MATRIX if getattr(args, k) is not None}
    spec = replace(plan.QUICK_SPEC if args.quick else plan.DEFAULT_SPEC, **given)
    budget = plan.QUICK_BUDGET if args.quick else plan.DEFAULT_BUDGET
    return Options(
        spec=spec,
        out_dir=args.out,
        fixed=frozenset(given),
        thresholds=Thresholds(
            target_concurrency=args.target_concurrency, **{n: getattr(args, n) for n in GATES}
        ),
        url=args.url,
        model_name=args.model_name,
        lanes=LaneOptions(
            args.model,
            args.draft_model,
            args.num_draft_tokens,
            max_batch_size=max(8, *spec.concurrency),
        ),
        api_key=args.api_key,
        budget=budget if args.budget is None else args.budget,
        warmup=args.warmup,
        plot=args.plot,
        progress=not args.no_progress,
        request_timeout=args.request_timeout,
        note=args.note,
    )


def scorecard(argv: list[str]) -> int:
    p = scorecard_parser()
    args = p.parse_args(argv)
    if args.render:
        return render(args.render, args.plot)
    try:
        opts = scorecard_options(args)
    except ValueError as e:
        p.error(str(e))
    if opts.spec.max_tokens < plan.MIN_MAX_TOKENS:
        print(
            f"note: --max-tokens {opts.spec.max_tokens} is at or below the router's "
            "short-output rule: `auto` will send everything to batching",
            file=sys.stderr,
        )
    if opts.plot and not plot.available():
        print(f"speclane bench: {plot.MISSING}", file=sys.stderr)
        return 2
    return asyncio.run(measure(opts))


async def measure(opts: Options) -> int:
    stop, measuring = asyncio.Event(), asyncio.Event()
    task = asyncio.current_task()
    assert task is not None
    loop = asyncio.get_running_loop()

    def interrupt() -> None:
        if measuring.is_set() and not stop.is_set():
            log("\nstopping: writing what was measured (Ctrl-C again to quit at once)")
            stop.set()
        else:
            task.cancel()

    loop.add_signal_handler(signal.SIGINT, interrupt)
    try:
        result, paths = await run_scorecard(opts, stop, log=log, measuring=measuring)
    except BenchError as e:
        print(f"speclane bench: {e}", file=sys.stderr)
        return 1
    except asyncio.CancelledError:
        print("speclane bench: interrupted; nothing written", file=sys.stderr)
        return INTERRUPTED
    finally:
        loop.remove_signal_handler(signal.SIGINT)
    ev = result.evaluation()
    print(f"\n{ev.verdict}  (readiness score {ev.score}/100)\n{ev.recommendation}")
    for name, path in paths.items():
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
            charts = plot.write_charts(result, path.parent)
        except plot.PlotUnavailable as e:
            print(f"speclane bench: {e}", file=sys.stderr)
            return 2
    print(f"  markdown: {report.write(result, path.parent, charts)['markdown']}")
    return 0


def log(text: str) -> None:
    print(text, file=sys.stderr, flush=True)
