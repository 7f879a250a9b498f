"""One scorecard run: router up (or attached), warm-up, plan, matrix, reports.

``run_scorecard`` is the async API the CLI and the tests call. Setting ``stop`` ends the
measurement after the requests in flight are cut short; the reports are still written
from what was measured.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp

from router.bench import environment, report
from router.bench.launch import LaneOptions, own_router
from router.bench.matrix import MatrixSpec
from router.bench.plan import DEFAULT_BUDGET, Plan, cell_seconds, fit, speeds_from
from router.bench.progress import Progress, clock
from router.bench.records import Measurement
from router.bench.result import Result
from router.bench.runner import Clock, Target, run_cells, warm_up
from router.bench.score import Thresholds

WARMUP_MAX_TOKENS = 12  # enough to time decoding; little time spent before measuring
Log = Callable[[str], None]


class BenchError(Exception):
    """The bench cannot run (no router, no model, every warm-up request failed)."""


@dataclass(frozen=True)
class Options:
    spec: MatrixSpec = field(default_factory=MatrixSpec)
    out_dir: Path = Path("speclane-scorecard")
    fixed: frozenset[str] = frozenset()  # dimensions the user set: never reduced
    thresholds: Thresholds = field(default_factory=Thresholds)
    url: str | None = None  # attach to a running router instead of starting one
    model_name: str | None = None  # the model id to request; default: the lanes' model
    lanes: LaneOptions = field(default_factory=LaneOptions)
    api_key: str | None = None
    budget: float | None = DEFAULT_BUDGET
    warmup: int = 1
    plot: bool = False
    progress: bool = True
    request_timeout: float = 600.0
    note: str | None = None


@dataclass
class Outcome:
    result: Result
    paths: dict[str, Path]
    charts: list[str] = field(default_factory=list)
    chart_error: str | None = None


@dataclass
class Phase:
    """Where the run is, for the Ctrl-C handler: before measuring there is nothing to keep,
    so an interrupt cancels outright; while measuring it sets ``stop``."""

    measuring: bool = False


async def run_scorecard(opts: Options, stop: asyncio.Event | None = None,
                        log: Log = print, phase: Phase | None = None) -> Outcome:
    stop = stop or asyncio.Event()
    phase = phase or Phase()
    opts.out_dir.mkdir(parents=True, exist_ok=True)
    async with contextlib.AsyncExitStack() as stack:
        if opts.url:
            base_url = normalize_url(opts.url)
            router = f"attached at {base_url}"
        else:
            log("starting a router with both lanes (the first start prepares the default "
                f"model and can take minutes; log: {opts.out_dir / 'router.log'})")
            try:
                base_url = await stack.enter_async_context(
                    own_router(opts.lanes, opts.out_dir / "router.log"))
            except (RuntimeError, TimeoutError) as e:
                raise BenchError(f"the router did not start ({e}); see "
                                 f"{opts.out_dir / 'router.log'}") from e
            router = f"started by the bench at {base_url} (temporary configuration)"
        session = await stack.enter_async_context(
            aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)))
        result = await _measure(session, base_url, router, opts, stop, log, phase)
        outcome = _write(result, opts, log)
    return outcome


async def _measure(session: aiohttp.ClientSession, base_url: str, router: str, opts: Options,
                   stop: asyncio.Event, log: Log, phase: Phase) -> Result:
    env = await _environment(session, base_url, router, opts)
    model = opts.model_name or env.get("model")
    if not model:
        raise BenchError(f"no model is served at {base_url} (GET /v1/models is empty)")
    env["model"] = model
    target = Target(base_url, model, opts.api_key, opts.request_timeout)
    clock_ = Clock()
    warmups = await _warm_up(session, target, opts, clock_, log)
    plan = fit(opts.spec, speeds_from(warmups), opts.budget, opts.fixed)
    _announce(plan, opts, log)
    estimates = _estimates(plan, warmups)
    progress = Progress(estimates, len(plan.cells), enabled=opts.progress)
    result = Result(opts.spec, plan, opts.thresholds, env, warmups, budget=opts.budget)
    started = clock_.now()
    phase.measuring = True
    progress.start_ticking()
    try:
        runs, stopped = await run_cells(
            session, target, plan.cells, plan.spec, clock_, stop,
            on_cell=lambda i, c: progress.cell_started(i, c, c.concurrency * plan.spec.runs),
            on_request=progress.request_done, on_cell_done=progress.cell_done)
    finally:
        phase.measuring = False
        progress.close()
    result.runs = runs
    result.complete = not stopped and len(runs) == len(plan.cells)
    if stopped:
        result.stopped = (f"stopped by the user after {sum(r.complete for r in runs)} of "
                          f"{len(plan.cells)} cells")
    result.duration = clock_.now() - started
    env.setdefault("load_average", {})["end"] = environment.load_average()
    return result


async def _environment(session: aiohttp.ClientSession, base_url: str, router: str,
                       opts: Options) -> dict[str, Any]:
    root = base_url.removesuffix("/v1")
    lanes = await environment.lanes_info(session, root, opts.api_key)
    served = await environment.served_models(session, base_url, opts.api_key)
    spec_lane = next((lane for lane in lanes if lane.get("lane") == "speculative"), {})
    model = next((lane.get("model") for lane in lanes if lane.get("model")), None)
    load = environment.load_average()
    hw = environment.hardware()
    env: dict[str, Any] = {
        "date": environment.now_iso(),
        "model": model or (served[0] if served else None),
        "draft_model": spec_lane.get("draft_model") or opts.lanes.draft_model,
        "num_draft_tokens": spec_lane.get("num_draft_tokens") or opts.lanes.num_draft_tokens,
        "router": router,
        "served_models": served,
        "lanes": lanes,
        "versions": environment.versions(),
        "hardware": hw,
        "load_average": {"start": load},
    }
    notes = [opts.note] if opts.note else []
    cpus = hw.get("cpus") or os.cpu_count() or 1
    if load and load[0] > 0.5 * cpus:
        notes.append(f"the machine was busy when the run started (load {load[0]} on {cpus} "
                     "CPUs): figures carry that noise")
    if notes:
        env["note"] = "; ".join(notes)
    return env


async def _warm_up(session: aiohttp.ClientSession, target: Target, opts: Options,
                   clock_: Clock, log: Log) -> list[Measurement]:
    if opts.warmup <= 0:
        return []
    spec = opts.spec.with_(max_tokens=min(opts.spec.max_tokens, WARMUP_MAX_TOKENS))
    log(f"warm-up: {opts.warmup} round(s) on each lane")
    warmups = await warm_up(session, target, spec, opts.spec.scenarios, clock_, opts.warmup)
    if warmups and not any(m.ok for m in warmups):
        raise BenchError(f"every warm-up request failed: {warmups[0].error}" + _hint(warmups))
    for m in warmups:
        if not m.ok:
            log(f"warm-up {m.scenario}/{m.family} failed: {m.error}")
    return warmups


def _hint(warmups: list[Measurement]) -> str:
    if any(m.status == 403 for m in warmups):
        return (" -- the bench picks lanes with the X-Speclane-Lane header; the router's "
                "policy must allow it (allow_lane_override = true)")
    if any(m.status == 401 for m in warmups):
        return " -- pass the router's API key with --api-key"
    return ""


def _estimates(plan: Plan, warmups: list[Measurement]) -> list[float] | None:
    speeds = speeds_from(warmups)
    if speeds is None:
        return None
    return [cell_seconds(c, plan.spec, speeds) for c in plan.cells]


def _announce(plan: Plan, opts: Options, log: Log) -> None:
    est = f", about {clock(plan.estimate)}" if plan.estimate is not None else ""
    log(f"measuring {len(plan.cells)} cells: {', '.join(plan.scenarios)} x "
        f"{', '.join(plan.families)} x c={','.join(map(str, plan.concurrency))}, "
        f"{plan.spec.runs} run(s), {plan.spec.max_tokens} tokens{est}")
    if plan.reductions:
        log(f"to fit the {clock(opts.budget)} budget: {'; '.join(plan.reductions)} "
            "(--budget 0 runs the whole matrix)")


def _write(result: Result, opts: Options, log: Log) -> Outcome:
    ev = result.evaluation()
    charts: list[str] = []
    chart_error = None
    if opts.plot:
        from router.bench import plot

        try:
            charts = plot.write_charts(result, ev, opts.out_dir)
        except plot.PlotUnavailable as e:
            chart_error = str(e)
            log(chart_error)
    paths = report.write(result, opts.out_dir, charts, ev)
    paths.update({name: opts.out_dir / name for name in charts})
    return Outcome(result, paths, charts, chart_error)


def normalize_url(url: str) -> str:
    url = url.rstrip("/")
    return url if url.endswith("/v1") else f"{url}/v1"
