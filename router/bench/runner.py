"""Drive the matrix: stream every request through the router and record what came back.

A cell at concurrency c runs c client loops side by side, each sending ``runs`` requests
back to back (a closed loop: the load stays at c until the loops finish). Each request is
streamed with ``stream_options.include_usage`` so that the last event carries the token
count and the draft statistics (``usage.speclane_spec``).

Stopping (Ctrl-C): the stop event cancels the cell in flight; its finished requests are
kept, the ones cut short are marked ``cancelled`` (neither a result nor an error).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import aiohttp
import orjson

from router import sse
from router.bench.matrix import SCENARIOS, Cell, MatrixSpec, request_body, request_headers
from router.bench.records import CellRun, Measurement

LANE_HEADER = "X-Speclane-Lane"
DECISION_HEADER = "X-Speclane-Decision"


@dataclass(frozen=True)
class Target:
    base_url: str  # the router's OpenAI base URL, ending in /v1
    model: str
    api_key: str | None = None
    request_timeout: float = 600.0


class Clock:
    """Seconds since the run started (one origin for every record)."""

    def __init__(self) -> None:
        self.origin = time.perf_counter()

    def now(self) -> float:
        return time.perf_counter() - self.origin


async def send(session: aiohttp.ClientSession, target: Target, m: Measurement,
               spec: MatrixSpec, clock: Clock) -> Measurement:
    """Stream one request and fill ``m`` in; never raises except on cancellation."""
    scenario = SCENARIOS[m.scenario]
    body = request_body(target.model, scenario, m.family, m.prompt_index, spec.max_tokens,
                        spec.long_prompt_chars)
    headers = request_headers(scenario, target.api_key)
    timeout = aiohttp.ClientTimeout(total=target.request_timeout)
    start = time.perf_counter()
    m.started = start - clock.origin
    try:
        async with session.post(f"{target.base_url}/chat/completions", data=orjson.dumps(body),
                                headers=headers, timeout=timeout) as resp:
            m.status = resp.status
            m.lane = resp.headers.get(LANE_HEADER)
            m.decision = resp.headers.get(DECISION_HEADER)
            if resp.status != 200:
                m.error = f"HTTP {resp.status}: {_error_message(await resp.read())}"
                return m
            await _read_stream(resp, m, start)
    except asyncio.CancelledError:
        m.cancelled = True
        raise
    except (aiohttp.ClientError, TimeoutError, ValueError) as e:
        m.error = f"{type(e).__name__}: {e}" if str(e) else type(e).__name__
    finally:
        m.e2e = time.perf_counter() - start
    return m


async def _read_stream(resp: aiohttp.ClientResponse, m: Measurement, start: float) -> None:
    done = False
    async for data in sse.read_payloads(resp.content):
        if sse.is_done(data):
            done = True
            break
        chunk = orjson.loads(data)
        if chunk.get("error"):
            m.error = f"stream error: {_error_message(data)}"
            return
        for choice in chunk.get("choices") or ():
            if (choice.get("delta") or {}).get("content"):
                now = time.perf_counter() - start
                if m.ttft is None:
                    m.ttft = now
                m.last_token = now
                m.content_chunks += 1
        if chunk.get("usage"):
            _read_usage(chunk["usage"], m)
    if not done:
        m.error = "the stream ended without data: [DONE]"
        return
    if m.completion_tokens is None:
        m.completion_tokens = m.content_chunks  # no usage: one token per content delta
    m.ok = True


def _read_usage(usage: dict[str, Any], m: Measurement) -> None:
    m.usage_reported = True
    m.completion_tokens = _int(usage.get("completion_tokens"))
    m.prompt_tokens = _int(usage.get("prompt_tokens"))
    spec = usage.get("speclane_spec")
    if isinstance(spec, dict):
        m.drafted = _int(spec.get("drafted"))
        m.accepted = _int(spec.get("accepted"))
        m.steps = _int(spec.get("steps"))
        m.num_draft_tokens = _int(spec.get("num_draft_tokens"))


def _int(value: object) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _error_message(body: bytes) -> str:
    try:
        data = orjson.loads(body)
        error = data.get("error") if isinstance(data, dict) else None
        if isinstance(error, dict) and error.get("message"):
            return str(error["message"])[:300]
    except orjson.JSONDecodeError:
        pass
    return body.decode(errors="replace").strip()[:300] or "(empty body)"


OnRequest = Callable[[Measurement], None]


async def run_cell(session: aiohttp.ClientSession, target: Target, cell: Cell,
                   spec: MatrixSpec, clock: Clock, on_request: OnRequest | None = None,
                   run: CellRun | None = None) -> CellRun:
    """Run one cell into ``run`` (created when not given, so a caller that cancels the
    cell still holds what was measured)."""
    run = run or CellRun(cell, spec.runs, spec.max_tokens)
    run.started = clock.now()

    async def loop(stream: int) -> None:
        for seq in range(spec.runs):
            m = Measurement(cell.scenario, cell.family, cell.concurrency, stream, seq,
                            prompt_index=stream * spec.runs + seq)
            run.measurements.append(m)
            await send(session, target, m, spec, clock)
            if on_request:
                on_request(m)

    try:
        async with asyncio.TaskGroup() as group:
            for stream in range(cell.concurrency):
                group.create_task(loop(stream))
        run.complete = True
    finally:
        run.finished = clock.now()
    return run


async def run_cells(session: aiohttp.ClientSession, target: Target, cells: Sequence[Cell],
                    spec: MatrixSpec, clock: Clock, stop: asyncio.Event,
                    on_cell: Callable[[int, Cell], None] | None = None,
                    on_request: OnRequest | None = None,
                    on_cell_done: Callable[[int, CellRun], None] | None = None,
                    ) -> tuple[list[CellRun], bool]:
    """Every cell in order until done or ``stop`` is set: (runs, stopped early)."""
    runs: list[CellRun] = []
    for index, cell in enumerate(cells):
        if stop.is_set():
            return runs, True
        if on_cell:
            on_cell(index, cell)
        run = CellRun(cell, spec.runs, spec.max_tokens)
        task = asyncio.create_task(run_cell(session, target, cell, spec, clock, on_request,
                                            run))
        stopper = asyncio.create_task(stop.wait())
        await asyncio.wait({task, stopper}, return_when=asyncio.FIRST_COMPLETED)
        stopper.cancel()
        if not task.done():
            task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        runs.append(run)
        if on_cell_done:
            on_cell_done(index, run)
        if not run.complete:
            return runs, True
    return runs, False


async def warm_up(session: aiohttp.ClientSession, target: Target, spec: MatrixSpec,
                  scenarios: Sequence[str], clock: Clock, rounds: int = 1,
                  on_request: OnRequest | None = None) -> list[Measurement]:
    """One short chat request per forced scenario (the lanes load their first batches, and
    the planner learns each lane's speed), plus one long prompt on the batching lane (how
    much longer prefill takes)."""
    done: list[Measurement] = []
    forced = [s for s in ("spec-on", "spec-off", "batching") if s in scenarios] or ["auto"]
    plan = [(s, "chat") for s in forced]
    long_lane = "batching" if "batching" in forced else forced[0]
    if "long" in spec.families:
        plan.append((long_lane, "long"))
    for r in range(rounds):
        for i, (scenario, family) in enumerate(plan):
            m = Measurement(scenario, family, 1, stream=0, seq=r, prompt_index=i + r)
            await send(session, target, m, spec, clock)
            done.append(m)
            if on_request:
                on_request(m)
    return done
