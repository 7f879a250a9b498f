"""``speclane bench`` against a real router whose lanes are fakes told their timings.

The speculative fake answers one request at a time (as the real lane does) and streams at
1/interval tokens per second, with the draft statistics it was told; the batching fake
answers any number at once. The figures the scorecard computes must be the ones the fakes
were told to produce: checked on the run's own records with the told timestamps injected
(a shared machine stretches the measured ones; tests never assert a measured speed).
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from router.bench.common.procs import write_policies
from router.bench.scorecard.plan import QUICK_SPEC
from router.bench.scorecard.records import CellRun, Measurement
from router.bench.scorecard.run import Options, run_scorecard
from router.bench.scorecard.score import evaluate
from tests.bench.scorecard.lanes import ToldLane, started, told
from tests.conftest import RunningRouter, lanes_router

TOKENS = 12
TTFT = 0.03
SPEC_INTERVAL, PLAIN_INTERVAL, BATCH_INTERVAL = 0.01, 0.02, 0.03
TOLD = {"chat": (12, 6), "list": (12, 11)}  # drafted, accepted per request


def fast_spec() -> ToldLane:
    return ToldLane(
        "spec",
        serial=True,
        plain=told(TTFT, PLAIN_INTERVAL, TOKENS),
        spec={f: told(TTFT, SPEC_INTERVAL, TOKENS, d, a) for f, (d, a) in TOLD.items()},
    )


def batching() -> ToldLane:
    return ToldLane("batch", plain=told(TTFT, BATCH_INTERVAL, TOKENS))


@asynccontextmanager
async def router(spec: ToldLane, batch: ToldLane, tmp_path: Path) -> AsyncIterator[RunningRouter]:
    async with (
        started(spec, batch),
        lanes_router(spec, batch, policies_dir=str(write_policies(tmp_path / "policies"))) as r,
    ):
        yield r


def options(r: RunningRouter, tmp_path: Path, **kw: Any) -> Options:
    kw.setdefault("spec", replace(QUICK_SPEC, concurrency=(1, 2, 4)))
    return Options(url=r.base_url, out_dir=tmp_path / "out", budget=0, progress=False, **kw)


def cells(data: dict[str, Any], scenario: str, c: int | None = None) -> list[dict[str, Any]]:
    return [
        x
        for x in data["cells"]
        if x["scenario"] == scenario and (c is None or x["concurrency"] == c)
    ]


def told_interval(m: Measurement) -> float:
    """The stream interval the lane that answered ``m`` was told."""
    if m.lane == "speculative":
        return SPEC_INTERVAL if m.num_draft_tokens else PLAIN_INTERVAL
    return BATCH_INTERVAL


def retimed(run: CellRun) -> CellRun:
    """The run with the timestamps the fakes were told instead of the measured ones (which a
    loaded machine stretches): the speculative lane serves one request at a time, in the
    order of the client loops, the batching lane all at once."""
    queue = 0.0  # when the speculative lane is free again, from the cell's start
    ends = []
    for m in sorted(run.measurements, key=lambda m: (m.seq, m.stream)):
        one = TTFT + (TOKENS - 1) * told_interval(m)
        wait = queue if m.lane == "speculative" else 0.0
        m.started, m.ttft = run.started, wait + TTFT
        m.last_token = m.e2e = wait + one
        if m.lane == "speculative":
            queue += one
        ends.append(m.e2e)
    run.finished = run.started + max(ends)
    return run


async def test_figures_match_what_the_lanes_were_told(tmp_path: Path) -> None:
    """What the run really produced (cells, tokens, drafts, lanes), then the scorecard's
    arithmetic on those records with the told timestamps injected: no measured speed or
    time is asserted, so a loaded machine cannot fail it."""
    spec, batch = fast_spec(), batching()
    async with router(spec, batch, tmp_path) as r:
        _, paths = await run_scorecard(options(r, tmp_path), log=lambda _: None)
    data = json.loads(paths["json"].read_text())
    assert data["complete"] is True
    assert len(data["cells"]) == 4 * 2 * 3
    for x in data["cells"]:
        assert len(x["measurements"]) == x["concurrency"]
        assert all(m["ok"] and m["completion_tokens"] == TOKENS for m in x["measurements"])
    for x in cells(data, "spec-on", 1):
        s = x["summary"]
        drafted, accepted = TOLD[x["family"]]
        assert (s["drafted"], s["accepted"]) == (drafted, accepted)
        assert s["acceptance"] == accepted / drafted
    for x in cells(data, "spec-off", 1):
        assert x["summary"]["drafted"] == 0 and x["summary"]["speculated"] == 0

    runs = [retimed(CellRun.from_json(x)) for x in data["cells"]]
    by = {(run.cell.scenario, run.cell.family, run.cell.concurrency): run for run in runs}
    for family in TOLD:
        s = by["spec-on", family, 1].summary()
        assert s.ttft_avg_ms == pytest.approx(TTFT * 1000)
        assert s.decode_tps_avg == pytest.approx(1 / SPEC_INTERVAL)
        assert by["spec-off", family, 1].summary().decode_tps_avg == pytest.approx(
            1 / PLAIN_INTERVAL
        )
        for c in (1, 2, 4):
            b = by["batching", family, c].summary()
            assert b.decode_tps_avg == pytest.approx(1 / BATCH_INTERVAL)
            assert b.ttft_p95_ms == pytest.approx(TTFT * 1000)  # all at once: no queueing
            assert b.agg_tps == pytest.approx(c * TOKENS / (TTFT + (TOKENS - 1) * BATCH_INTERVAL))

    # the speculative lane decodes one request at a time: at c=4 the last waits for three
    one = TTFT + (TOKENS - 1) * SPEC_INTERVAL
    for family in TOLD:
        s = by["spec-on", family, 4].summary()
        assert s.ttft_p95_ms >= 1000 * (TTFT + 2.5 * one)  # type: ignore[operator]
        assert s.agg_tps == pytest.approx(TOKENS / one)

    ev = evaluate(runs)
    gates = {g.key: g.passed for g in ev.gates}
    assert gates["active"] is gates["errors"] is gates["acceptance"] is gates["interactive"]
    assert gates["active"] is True
    assert ev.acceptance == pytest.approx(17 / 24)
    assert {a.family: a.acceptance for a in ev.acceptance_by_family} == {
        "chat": 0.5,
        "list": pytest.approx(11 / 12),
    }
    # told: spec 1 request at a time at ~86 tok/s; batching 33 tok/s per request, in parallel
    assert [lv.pays for lv in ev.levels] == [True, True, False]
    assert ev.stop_at_concurrency == 4
    assert ev.verdict.startswith("READY FOR INTERACTIVE USE")
    assert "spec_busy_at = 3" in ev.recommendation
    assert data["pairs"][0]["acceptance_by_family"]["list"] == pytest.approx(11 / 12)
    assert data["pairs"][0]["passed_floor"] is True

    # the lane of every request is the one that answered it
    lanes = [m["lane"] for x in data["cells"] for m in x["measurements"]]
    warm = [m["lane"] for m in data["warmup"]]
    assert lanes.count("speculative") + warm.count("speculative") == spec.count
    assert lanes.count("batching") + warm.count("batching") == batch.count
    assert {m["lane"] for x in cells(data, "spec-off") for m in x["measurements"]} == {
        "speculative"
    }
    for x in cells(data, "auto"):
        assert sum(x["summary"]["lanes"].values()) == x["concurrency"]

    text = paths["markdown"].read_text()  # what was measured, as written
    written = data["evaluation"]
    assert f"**Verdict: {written['verdict']}**" in text
    assert f"Readiness score: **{written['score']}/100**" in text


async def test_speculation_slower_than_plain_decoding_is_not_ready(tmp_path: Path) -> None:
    spec = ToldLane(
        "spec", serial=True, plain=told(TTFT, 0.01, TOKENS), spec=told(TTFT, 0.03, TOKENS, 12, 3)
    )
    batch = batching()
    async with router(spec, batch, tmp_path) as r:
        result, _ = await run_scorecard(
            options(r, tmp_path, spec=replace(QUICK_SPEC, families=("chat",), concurrency=(1,))),
            log=lambda _: None,
        )
    ev = result.evaluation()
    assert ev.gate("interactive").passed is False
    assert ev.gate("acceptance").passed is False  # 3/12 < 0.45
    assert ev.stop_at_concurrency == 1
    assert ev.verdict.startswith("NOT READY") and "keep speculation off" in ev.verdict
    speedup = next(p for p in ev.score_parts if p.key == "speedup")
    assert speedup.points == 0


async def test_a_stop_keeps_what_was_measured(tmp_path: Path) -> None:
    spec, batch = fast_spec(), batching()
    stop = asyncio.Event()
    measuring = asyncio.Event()
    async with router(spec, batch, tmp_path) as r:

        async def stop_soon() -> None:
            await spec.answered(2 + 3)  # the warm-up's two, then three measured
            assert measuring.is_set()
            stop.set()

        stopper = asyncio.create_task(stop_soon())
        result, paths = await run_scorecard(
            options(r, tmp_path), stop, log=lambda _: None, measuring=measuring
        )
        await stopper
    assert not result.complete
    assert result.stopped and result.stopped.startswith("stopped by the user")
    assert 0 < len(result.runs) < len(result.plan.cells)
    data = json.loads(paths["json"].read_text())
    assert data["complete"] is False
    assert len(data["cells"]) == len(result.runs)
    measured = [m for x in data["cells"] for m in x["measurements"] if m["ok"]]
    assert len(measured) >= 3
    assert all(not m["error"] for x in data["cells"] for m in x["measurements"])
    text = paths["markdown"].read_text()
    assert "_This run is partial: stopped by the user" in text


async def test_ctrl_c_on_the_command_line_still_writes_the_scorecard(tmp_path: Path) -> None:
    spec, batch = fast_spec(), batching()
    out = tmp_path / "cli"
    async with router(spec, batch, tmp_path) as r:
        proc = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "router",
            "bench",
            "--url",
            r.base_url,
            "--quick",
            "--concurrency",
            "1,2,4",
            "--budget",
            "0",
            "--out",
            str(out),
            "--no-progress",
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
            env={**os.environ, "PYTHONUNBUFFERED": "1"},
        )
        try:
            await asyncio.wait_for(spec.answered(2 + 3), 60)
            proc.send_signal(signal.SIGINT)
            stdout, stderr = await asyncio.wait_for(proc.communicate(), 60)
        finally:
            if proc.returncode is None:
                proc.kill()
                await proc.wait()
    assert proc.returncode == 130, stderr.decode()
    assert b"stopping: writing what was measured" in stderr
    data = json.loads((out / "scorecard.json").read_text())
    assert data["complete"] is False and data["cells"]
    assert (out / "scorecard.md").read_text().startswith("# Speculative decoding readiness")
    assert b"scorecard.md" in stdout


async def test_lane_overrides_refused_by_policy_fail_clearly(tmp_path: Path) -> None:
    spec, batch = fast_spec(), batching()
    policies = tmp_path / "closed"
    policies.mkdir()
    (policies / "default.toml").write_text('client = "default"\nallow_lane_override = false\n')
    async with started(spec, batch), lanes_router(spec, batch, policies_dir=str(policies)) as r:
        from router.bench.scorecard.run import BenchError

        with pytest.raises(BenchError, match="allow_lane_override = true"):
            await run_scorecard(
                options(r, tmp_path, spec=replace(QUICK_SPEC, scenarios=("spec-on", "batching"))),
                log=lambda _: None,
            )
