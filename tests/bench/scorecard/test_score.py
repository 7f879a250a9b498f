"""Gates, score, crossover and verdict on hand-built matrices with known figures."""

from __future__ import annotations

import pytest

from router.bench.scorecard.records import CellRun
from router.bench.scorecard.score import Thresholds, evaluate
from tests.bench.scorecard.build import cell, req, uniform


def matrix(
    *,
    spec_tps: float = 20.0,
    spec_ttft: float = 0.11,
    off_tps: float = 10.0,
    spec_agg: tuple[float, float] = (18.0, 18.0),
    batch_agg: tuple[float, float] = (8.5, 30.0),
    auto_agg: tuple[float, float] = (17.0, 28.0),
    drafted: int = 12,
    accepted: int = 6,
    families: tuple[str, ...] = ("chat",),
) -> list[CellRun]:
    runs = []
    for i, c in enumerate((1, 4)):
        for f in families:
            runs += [
                uniform(
                    "spec-on",
                    f,
                    c,
                    ttft=spec_ttft,
                    tps=spec_tps,
                    agg=spec_agg[i],
                    drafted=drafted,
                    accepted=accepted,
                ),
                uniform("spec-off", f, c, ttft=0.1, tps=off_tps, agg=9.5),
                uniform("batching", f, c, ttft=0.1, tps=9.0, agg=batch_agg[i]),
                uniform("auto", f, c, ttft=0.1, tps=15.0, agg=auto_agg[i]),
            ]
    return runs


def test_spec_pays_alone_but_not_under_load() -> None:
    ev = evaluate(matrix())
    g = {gate.key: gate.passed for gate in ev.gates}
    assert g == {
        "active": True,
        "errors": True,
        "acceptance": True,
        "interactive": True,
        "throughput": False,
    }
    assert "2.00x" in ev.gate("interactive").figure  # decode 10 -> 20 tok/s
    assert "1.10x" in ev.gate("interactive").figure  # TTFT 100 -> 110 ms
    assert "(0.93x)" in ev.gate("throughput").figure  # auto 28 vs batching 30 at c=4
    assert [(lv.concurrency, lv.alternative, lv.pays) for lv in ev.levels] == [
        (1, "spec-off", True),
        (4, "batching", False),
    ]
    assert ev.levels[1].ratio == pytest.approx(18 / 30)
    assert ev.stop_at_concurrency == 4
    assert ev.verdict.startswith("READY FOR INTERACTIVE USE")
    assert "spec_busy_at = 3" in ev.recommendation and "spec_free_at = 2" in ev.recommendation
    points = {p.key: p.points for p in ev.score_parts}
    assert points["active"] == pytest.approx(10)
    assert points["errors"] == pytest.approx(10)
    assert points["acceptance"] == pytest.approx(20)  # 0.5 >= floor 0.45: full
    assert points["speedup"] == pytest.approx(25)  # 2.0x >= 1.5x: full
    assert points["ttft"] == pytest.approx(10)  # 1.10x <= 1.25x: full
    assert points["throughput"] == pytest.approx(15 * (28 / 30 - 0.5) / 0.45)
    assert points["range"] == pytest.approx(5)  # pays at 1 of 2 levels
    assert ev.score == round(sum(points.values())) == 94


def test_spec_slower_than_plain_decoding_is_not_ready() -> None:
    ev = evaluate(matrix(spec_tps=8.0, spec_agg=(7.0, 7.0)))
    assert ev.gate("interactive").passed is False
    assert "0.80x" in ev.gate("interactive").figure
    assert ev.stop_at_concurrency == 1
    assert ev.verdict.startswith("NOT READY") and "keep speculation off" in ev.verdict
    assert {p.key: p.points for p in ev.score_parts}["speedup"] == 0


def test_everything_passes() -> None:
    ev = evaluate(matrix(spec_agg=(18.0, 40.0), batch_agg=(8.5, 30.0), auto_agg=(17.0, 31.0)))
    assert all(g.passed for g in ev.gates)
    assert ev.stop_at_concurrency is None
    assert ev.verdict == "READY: enable speculation"
    assert ev.score == 100


def test_no_draft_statistics_means_speculation_is_not_running() -> None:
    ev = evaluate(matrix(drafted=0, accepted=0))
    assert ev.gate("active").passed is False
    assert ev.gate("acceptance").passed is None
    assert ev.verdict.endswith("speculation is not running")


def test_errors_fail_the_reliability_gate() -> None:
    runs = matrix()
    runs.append(cell("batching", "code", 1, [req("batching", ok=False, error="HTTP 500: x")], 1.0))
    ev = evaluate(runs)
    assert ev.gate("errors").passed is False
    assert "1 of 21 requests failed" in ev.gate("errors").figure
    assert ev.verdict.endswith("requests failed")
    errors_points = {p.key: p.points for p in ev.score_parts}["errors"]
    assert errors_points == pytest.approx(10 * (1 - (1 / 21) / 0.10))


def test_missing_baseline_is_inconclusive() -> None:
    runs = [r for r in matrix() if r.cell.scenario != "spec-off"]
    ev = evaluate(runs, complete=False)
    assert ev.gate("interactive").passed is None
    assert ev.verdict == "INCONCLUSIVE (partial run)"


@pytest.mark.parametrize(("spec_tps", "passed"), [(11.1, True), (10.9, False)])
def test_interactive_speedup_threshold(spec_tps: float, passed: bool) -> None:
    ev = evaluate(matrix(spec_tps=spec_tps))
    assert ev.gate("interactive").passed is passed


@pytest.mark.parametrize(("ttft", "passed"), [(0.124, True), (0.126, False)])
def test_interactive_ttft_threshold(ttft: float, passed: bool) -> None:
    ev = evaluate(matrix(spec_ttft=ttft))
    assert ev.gate("interactive").passed is passed


@pytest.mark.parametrize(("accepted", "passed"), [(45, True), (44, False)])
def test_acceptance_floor(accepted: int, passed: bool) -> None:
    ev = evaluate(matrix(drafted=100, accepted=accepted))
    assert ev.gate("acceptance").passed is passed
    assert ev.acceptance == pytest.approx(accepted / 100)


def test_acceptance_by_family_and_pooled() -> None:
    runs = [
        uniform("spec-on", "chat", 1, ttft=0.1, tps=10, agg=9, n=2, drafted=10, accepted=3),
        uniform("spec-on", "list", 1, ttft=0.1, tps=10, agg=9, n=2, drafted=10, accepted=9),
    ]
    ev = evaluate(runs, Thresholds(acceptance_floor=0.5))
    by = {
        a.family: (a.drafted, a.accepted, a.acceptance, a.passed) for a in ev.acceptance_by_family
    }
    assert by == {"chat": (20, 6, 0.3, False), "list": (20, 18, 0.9, True)}
    assert ev.acceptance == pytest.approx(24 / 40)
    assert ev.gate("acceptance").passed is True


def test_throughput_gate_without_auto_compares_spec_on_and_an_explicit_target() -> None:
    runs = [r for r in matrix() if r.cell.scenario != "auto"]
    ev = evaluate(runs, Thresholds(target_concurrency=1))
    assert ev.gate("throughput").title.endswith("(c=1)")
    assert "spec-on 18.0 vs batching 8.5" in ev.gate("throughput").figure
    assert ev.gate("throughput").passed is True


def test_comparisons_use_shared_families_only() -> None:
    # spec-off measured only for chat; code's fast spec-on must not inflate the speed-up
    runs = [
        uniform("spec-on", "chat", 1, ttft=0.1, tps=12, agg=10),
        uniform("spec-on", "code", 1, ttft=0.1, tps=100, agg=90),
        uniform("spec-off", "chat", 1, ttft=0.1, tps=10, agg=9),
    ]
    ev = evaluate(runs)
    assert "(1.20x)" in ev.gate("interactive").figure
