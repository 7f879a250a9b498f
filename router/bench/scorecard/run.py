"""One scorecard run: router up (or attached), warm-up, plan, every cell, reports. A cell at
concurrency c runs c closed client loops side by side, each sending ``runs`` streamed requests
back to back. Setting ``stop`` (Ctrl-C) cancels the cell in flight: its finished requests are
kept, the ones cut short are marked ``cancelled``, and the reports are still written."""

from __future__ import annotations

import asyncio
import contextlib
import io
import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import aiohttp

from router.bench.common import BENCH_CLIENT, environment, procs
from router.bench.common.stream import Reply, stream
from router.bench.scorecard import report
from router.bench.scorecard.plan import (
    DEFAULT_BUDGET,
    SCENARIOS,
    MatrixSpec,
    Plan,
    fit,
)
from router.bench.scorecard.progress import Progress, clock
from router.bench.scorecard.prompts import prompt_for
from router.bench.scorecard.records import CellRun, Measurement, speeds_from
from router.bench.scorecard.report import Result
from router.bench.scorecard.score import Thresholds
from router.config.names import CLIENT_HEADER, DECISION_HEADER, LANE_HEADER
from router.kernel.worker_contract import DEFAULT_DRAFT_TOKENS

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
    lanes: procs.LaneOptions = field(default_factory=procs.LaneOptions)
    api_key: str | None = None
    budget: float | None = DEFAULT_BUDGET
    warmup: int = 1
    plot: bool = False
    progress: bool = True
    request_timeout: float = 600.0
    note: str | None = None


@dataclass(frozen=True)
class Target:
    session: aiohttp.ClientSession
    base_url: str  # the router's OpenAI base URL, ending in /v1
    model: str
    opts: Options
    origin: float = field(default_factory=time.perf_counter)  # every record's time zero

    def now(self) -> float:
        return time.perf_counter() - self.origin


async def send(target: Target, m: Measurement, spec: MatrixSpec) -> Measurement:
    """Stream one greedy (temperature 0) chat request, comparable across scenarios, and fill
    ``m`` in; never raises except on cancellation."""
    url, opts, reply = f"{target.base_url}/chat/completions", target.opts, Reply()
    scenario = SCENARIOS[m.scenario]
    headers = {"Content-Type": "application/json", "Accept": "text/event-stream"}
    if scenario.lane_header:  # a forced scenario, with the bench's own policy
        headers |= {LANE_HEADER: scenario.lane_header, CLIENT_HEADER: BENCH_CLIENT}
    if opts.api_key:
        headers["Authorization"] = f"Bearer {opts.api_key}"
    prompt = prompt_for(m.family, m.prompt_index, spec.long_prompt_chars)
    body = {
        "model": target.model,
        "messages": [{"role": "user", "content": prompt}],
        "max_tokens": spec.max_tokens,
        "temperature": 0,
        "stream": True,
        "stream_options": {"include_usage": True},
        **scenario.body_extra,
    }
    limit = aiohttp.ClientTimeout(total=opts.request_timeout)
    try:
        await stream(target.session, url, body, headers, reply, limit=limit)
    except asyncio.CancelledError:
        m.cancelled = True
        raise
    finally:
        m.started, m.e2e = reply.sent - target.origin, time.perf_counter() - reply.sent
        if reply.token_times:
            m.ttft = reply.token_times[0] - reply.sent
            m.last_token = reply.token_times[-1] - reply.sent
        m.content_chunks = len(reply.token_times)
        m.status = reply.status
        m.lane, m.decision = reply.headers.get(LANE_HEADER), reply.headers.get(DECISION_HEADER)
    if usage := reply.usage:  # the last event's (stream_options.include_usage)
        m.usage_reported = True
        m.completion_tokens, m.prompt_tokens = _ints(usage, "completion_tokens", "prompt_tokens")
        if isinstance(spec_stats := usage.get("speclane_spec"), dict):
            m.drafted, m.accepted, m.steps, m.num_draft_tokens = _ints(
                spec_stats, "drafted", "accepted", "steps", "num_draft_tokens"
            )
    m.error = reply.error or (None if reply.done else "the stream ended without data: [DONE]")
    if m.error is None:
        if m.completion_tokens is None:
            m.completion_tokens = m.content_chunks  # no usage: one token per content delta
        m.ok = True
    return m


def _ints(data: dict[str, Any], *keys: str) -> list[int | None]:
    return [
        v if isinstance(v := data.get(k), int) and not isinstance(v, bool) else None for k in keys
    ]


async def run_cells(
    target: Target, plan: Plan, stop: asyncio.Event, progress: Progress
) -> tuple[list[CellRun], bool]:
    """Every cell in order until done or ``stop`` is set: (runs, stopped early). A cell cut
    short keeps what it measured."""
    spec, runs = plan.spec, list[CellRun]()
    for cell in plan.cells:
        if stop.is_set():
            return runs, True
        progress.start_cell(cell, cell.concurrency * spec.runs)
        run = CellRun(cell, spec.runs, spec.max_tokens, started=target.now())

        async def loop(stream: int, run: CellRun = run) -> None:
            for seq in range(spec.runs):
                c = run.cell
                m = Measurement(
                    c.scenario, c.family, c.concurrency, stream, seq, stream * spec.runs + seq
                )
                run.measurements.append(m)
                await send(target, m, spec)
                progress.request_done()

        async def all_loops(run: CellRun = run) -> None:
            async with asyncio.TaskGroup() as group:
                for stream in range(run.cell.concurrency):
                    group.create_task(loop(stream))
            run.complete = True

        task, stopper = asyncio.create_task(all_loops()), asyncio.create_task(stop.wait())
        await asyncio.wait({task, stopper}, return_when=asyncio.FIRST_COMPLETED)
        stopper.cancel()
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        run.finished = target.now()
        runs.append(run)
        progress.cell_done(run)
        if not run.complete:
            return runs, True
    return runs, False


async def run_scorecard(
    opts: Options,
    stop: asyncio.Event | None = None,
    log: Log = print,
    measuring: asyncio.Event | None = None,
) -> tuple[Result, dict[str, Path]]:
    """The whole run; the result and every file written. ``measuring`` is set while cells
    run: before that there is nothing to keep, so the Ctrl-C handler cancels outright."""
    stop, measuring = stop or asyncio.Event(), measuring or asyncio.Event()
    log_path = opts.out_dir / "router.log"
    opts.out_dir.mkdir(parents=True, exist_ok=True)
    async with contextlib.AsyncExitStack() as stack:
        if opts.url:
            base_url = normalize_url(opts.url)
            router = f"attached at {base_url}"
        else:
            log(
                "starting a router with both lanes (the first start prepares the default "
                f"model and can take minutes; log: {log_path})"
            )
            try:
                base_url = await stack.enter_async_context(procs.own_router(opts.lanes, log_path))
            except (RuntimeError, TimeoutError) as e:
                raise BenchError(f"the router did not start ({e}); see {log_path}") from e
            router = f"started by the bench at {base_url} (temporary configuration)"
        connector = aiohttp.TCPConnector(limit=0)
        session = await stack.enter_async_context(aiohttp.ClientSession(connector=connector))
        env = await _environment(session, base_url, router, opts)
        if not (model := opts.model_name or env.get("model")):
            raise BenchError(f"no model is served at {base_url} (GET /v1/models is empty)")
        env["model"] = model
        target = Target(session, base_url, model, opts)
        warmups = await warm_up(target, log)
        plan = fit(opts.spec, speeds_from(warmups), opts.budget, opts.fixed)
        estimate = f", about {clock(plan.estimate)}" if plan.estimate is not None else ""
        log(
            f"measuring {len(plan.cells)} cells: {', '.join(plan.scenarios)} x "
            f"{', '.join(plan.families)} x c={','.join(map(str, plan.concurrency))}, "
            f"{plan.spec.runs} run(s), {plan.spec.max_tokens} tokens{estimate}"
        )
        if plan.reductions:
            cuts = "; ".join(plan.reductions)
            log(
                f"to fit the {clock(opts.budget)} budget: {cuts} (--budget 0 runs the whole matrix)"
            )
        # --no-progress: the lines go nowhere (a StringIO is not a terminal: no redraws).
        progress = Progress(
            plan.cell_estimates, len(plan.cells), None if opts.progress else io.StringIO()
        )
        result = Result(opts.spec, plan, opts.thresholds, env, warmups, budget=opts.budget)
        started = target.now()
        measuring.set()
        progress.start_ticking()
        try:
            result.runs, stopped = await run_cells(target, plan, stop, progress)
        finally:
            measuring.clear()
            progress.close()
        result.duration = target.now() - started
        env.setdefault("load_average", {})["end"] = environment.load_average()
    result.complete = not stopped and len(result.runs) == len(plan.cells)
    if stopped:
        done = sum(r.complete for r in result.runs)
        result.stopped = f"stopped by the user after {done} of {len(plan.cells)} cells"
    charts: list[str] = []
    if opts.plot:
        from router.bench.scorecard import plot

        try:
            charts = plot.write_charts(result, opts.out_dir)
        except plot.PlotUnavailable as e:
            log(str(e))
    paths = report.write(result, opts.out_dir, charts)
    return result, {**paths, **{name: opts.out_dir / name for name in charts}}


async def _environment(
    session: aiohttp.ClientSession, base_url: str, router: str, opts: Options
) -> dict[str, Any]:
    lanes = await environment.lanes_info(session, base_url.removesuffix("/v1"), opts.api_key)
    served = await environment.served_models(session, base_url, opts.api_key)
    spec_lane = next((lane for lane in lanes if lane.get("lane") == "speculative"), {})
    model = next((lane.get("model") for lane in lanes if lane.get("model")), None)
    load, hw = environment.load_average(), environment.hardware()
    env: dict[str, Any] = {
        "date": environment.now_iso(),
        "model": model or (served[0] if served else None),
        "draft_model": spec_lane.get("draft_model") or opts.lanes.draft_model,
        # the draft model's k (the lane's own figure under auto is its longest free draft)
        "num_draft_tokens": opts.lanes.num_draft_tokens or DEFAULT_DRAFT_TOKENS,
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
        notes.append(
            f"the machine was busy when the run started (load {load[0]} on {cpus} "
            "CPUs): figures carry that noise"
        )
    if notes:
        env["note"] = "; ".join(notes)
    return env


async def warm_up(target: Target, log: Log) -> list[Measurement]:
    """One short chat request per forced scenario (the lanes load their first batches, and
    the planner learns each lane's speed), plus one long prompt on the batching lane (how
    much longer prefill takes)."""
    opts = target.opts
    if opts.warmup <= 0:
        return []
    spec = replace(opts.spec, max_tokens=min(opts.spec.max_tokens, WARMUP_MAX_TOKENS))
    log(f"warm-up: {opts.warmup} round(s) on each lane")
    forced: list[str] = [s for s in ("spec-on", "spec-off", "batching") if s in spec.scenarios]
    forced = forced or ["auto"]
    plan = [(s, "chat") for s in forced]
    if "long" in spec.families:
        plan.append(("batching" if "batching" in forced else forced[0], "long"))
    warmups = []
    for r in range(opts.warmup):
        for i, (scenario, family) in enumerate(plan):
            m = Measurement(scenario, family, 1, stream=0, seq=r, prompt_index=i + r)
            warmups.append(await send(target, m, spec))
    if warmups and not any(m.ok for m in warmups):
        hint = ""
        if any(m.status == 403 for m in warmups):
            hint = (
                " -- the bench picks lanes with the X-Speclane-Lane header; the router's "
                "policy must allow it (allow_lane_override = true)"
            )
        elif any(m.status == 401 for m in warmups):
            hint = " -- pass the router's API key with --api-key"
        raise BenchError(f"every warm-up request failed: {warmups[0].error}{hint}")
    for m in warmups:
        if not m.ok:
            log(f"warm-up {m.scenario}/{m.family} failed: {m.error}")
    return warmups


def normalize_url(url: str) -> str:
    url = url.rstrip("/")
    return url if url.endswith("/v1") else f"{url}/v1"
