"""Fitting the matrix into a time budget, speeds from the warm-up, the time left."""

from __future__ import annotations

import io
from dataclasses import replace

import pytest

from router.bench.scorecard.plan import (
    BATCH_EXPONENT,
    MIN_MAX_TOKENS,
    Cell,
    LaneSpeed,
    MatrixSpec,
    Plan,
    Speeds,
    cell_seconds,
    fit,
)
from router.bench.scorecard.progress import Progress, clock
from router.bench.scorecard.records import speeds_from
from tests.bench.scorecard.build import req, uniform

# 1 s to the first token, 10 tok/s after it, on every lane; long prompts 3x slower to start.
SPEEDS = Speeds({s: LaneSpeed(1.0, 10.0) for s in ("spec-on", "spec-off", "batching")}, 3.0)
SPEC = MatrixSpec(runs=2, max_tokens=64, concurrency=(1, 2, 4, 8))


def test_cell_estimates() -> None:
    spec = MatrixSpec(runs=2, max_tokens=21)
    one = 1.0 + 20 / 10.0  # TTFT + the rest at 10 tok/s
    assert cell_seconds(Cell("spec-on", "chat", 4), spec, SPEEDS) == pytest.approx(4 * 2 * one)
    assert cell_seconds(Cell("spec-off", "long", 1), spec, SPEEDS) == pytest.approx(2 * 5.0)
    assert cell_seconds(Cell("batching", "chat", 4), spec, SPEEDS) == pytest.approx(
        2 * one * 4**BATCH_EXPONENT
    )
    assert cell_seconds(Cell("auto", "chat", 1), spec, SPEEDS) == pytest.approx(2 * one)


def test_no_budget_or_no_speeds_runs_the_whole_matrix() -> None:
    assert fit(SPEC, SPEEDS, None).cells == SPEC.cells()
    assert fit(SPEC, SPEEDS, 0).reductions == ()
    plan = fit(SPEC, None, 10)
    assert plan.cells == SPEC.cells() and plan.estimate is None


def test_a_large_budget_changes_nothing() -> None:
    plan = fit(SPEC, SPEEDS, 1e9)
    assert plan.reductions == () and plan.spec == SPEC
    assert len(plan.cells) == 4 * 4 * 4


def test_reductions_follow_the_stated_order_and_stop_when_it_fits() -> None:
    full = fit(SPEC, SPEEDS, None).estimate
    assert full is not None
    one_run = fit(SPEC, SPEEDS, full * 0.6)
    assert one_run.reductions == ("runs 2 → 1",)
    assert one_run.estimate is not None and one_run.estimate <= full * 0.6

    tight = fit(SPEC, SPEEDS, 600)
    assert tight.reductions[:2] == ("runs 2 → 1", f"max_tokens 64 → 32 → {MIN_MAX_TOKENS}")
    assert tight.estimate is not None and tight.estimate <= 600
    assert min(tight.concurrency) == 1

    smallest = fit(SPEC, SPEEDS, 1)
    assert smallest.reductions == (
        "runs 2 → 1",
        f"max_tokens 64 → 32 → {MIN_MAX_TOKENS}",
        "concurrency 1,2,4,8 → 1,2,4 → 1,2",
        "families above c=1: chat,code,list,long → chat,code,list → chat,code → chat",
        "concurrency 1,2 → 1",
        "families chat,code,list,long → chat,code,list → chat,code → chat",
    )
    assert smallest.cells == tuple(Cell(s, "chat", 1) for s in SPEC.scenarios)


def test_fixed_dimensions_are_never_reduced() -> None:
    plan = fit(SPEC, SPEEDS, 1, fixed=frozenset({"concurrency", "max_tokens"}))
    assert plan.concurrency == (1, 2, 4, 8)
    assert plan.spec.max_tokens == 64
    assert plan.reductions[0] == "runs 2 → 1"


def test_families_above_the_lowest_level_go_before_the_levels() -> None:
    plan = fit(replace(SPEC, concurrency=(1, 2), runs=1, max_tokens=MIN_MAX_TOKENS), SPEEDS, 120)
    assert plan.concurrency == (1, 2)
    loaded = {c.family for c in plan.cells if c.concurrency == 2}
    assert {c.family for c in plan.cells if c.concurrency == 1} == set(SPEC.families)
    assert loaded < set(SPEC.families)


def test_speeds_from_the_warm_up() -> None:
    warm = [
        req("spec-on", ttft=0.5, tps=4.0),
        req("spec-off", ttft=0.4, tps=8.0),
        req("batching", ttft=0.4, tps=9.0),
        req("batching", "long", ttft=2.0, tps=9.0),
        req("spec-on", ok=False, error="x"),
    ]
    speeds = speeds_from(warm)
    assert speeds is not None
    assert speeds.of("spec-on") == LaneSpeed(0.5, pytest.approx(4.0))  # type: ignore[arg-type]
    assert speeds.long_ttft_factor == pytest.approx(5.0)
    # a lane not warmed up is assumed as slow as the slowest known
    assert speeds_from([req("spec-off", ttft=0.4, tps=8.0)]).of("batching").ttft == 0.4  # type: ignore[union-attr]
    assert speeds_from([req(ok=False, error="x")]) is None


def test_progress_line_and_time_left() -> None:
    cells = SPEC.cells()[:4]
    out = io.StringIO()
    p = Progress([10.0, 10.0, 20.0, 40.0], len(cells), out=out)
    p.started -= 30  # 30 s ago
    assert p.time_left(p.started) == pytest.approx(80.0)  # nothing done: the estimate
    p.start_cell(cells[0], 2)
    p.cell_done(uniform("spec-on", "chat", 1, ttft=0.1, tps=10, agg=11 / 20))  # took 20 s
    # 70 s of estimate left, the first cell took 2x its estimate
    assert p.time_left(p.started + 30) == pytest.approx(140.0)
    line = p.line()
    assert "1/4 cells" in line and "0:30 elapsed" in line and "~2:20 left" in line
    assert "spec-on · chat · c=1" in out.getvalue()  # not a terminal: one line per cell


def test_progress_without_estimates_uses_the_average_cell() -> None:
    p = Progress((), 4, out=io.StringIO())
    assert p.time_left(p.started) is None
    p.cell_done(uniform("spec-on", "chat", 1, ttft=0.1, tps=10, agg=11 / 10))
    assert p.time_left(p.started) == pytest.approx(30.0)


def test_line_and_clock() -> None:
    assert clock(59.6) == "1:00" and clock(3725) == "1:02:05" and clock(None) == "?"
    p = Progress([], 12, out=io.StringIO())
    p.started -= 61
    p.done, p.done_seconds = 3, 100.0
    p.start_cell(Cell("auto", "code", 4), 4)
    p.request_done()
    line = p.line()
    assert line.startswith("[" + "#" * 6 + "." * 18 + "] 3/12 cells auto · code · c=4")
    assert "(1/4 requests) | 1:01 elapsed, ~5:00 left" in line


def test_plan_properties() -> None:
    spec = replace(SPEC, families=("code", "chat"))
    plan = Plan(spec, spec.cells())
    assert plan.families == ("code", "chat")
    assert plan.concurrency == (1, 2, 4, 8)
