"""Per-request and per-cell figures from known records."""

from __future__ import annotations

import pytest

from router.bench.common.stats import percentile
from router.bench.scorecard.records import (
    CellRun,
    Measurement,
    load,
    pooled,
    rule_of,
    shared_pair,
    summarize,
)
from tests.bench.scorecard.build import cell, req, uniform


def test_decode_tps_is_tokens_after_the_first_over_their_span() -> None:
    m = req(ttft=0.5, tokens=21, tps=8.0)
    assert m.last_token == pytest.approx(0.5 + 20 / 8.0)
    assert m.decode_tps == pytest.approx(8.0)


@pytest.mark.parametrize(
    "change",
    [
        {"completion_tokens": 1},
        {"completion_tokens": None},
        {"ok": False},
        {"ttft": None},
    ],
)
def test_decode_tps_is_none_without_two_tokens_and_a_span(change: dict[str, object]) -> None:
    m = req(tokens=5)
    for key, value in change.items():
        setattr(m, key, value)
    assert m.decode_tps is None


def test_summary_figures() -> None:
    ttfts = [0.1, 0.2, 0.3, 0.4, 1.0]
    requests = [
        req(ttft=t, tokens=11, tps=10.0 * (i + 1), e2e=2.0 + i) for i, t in enumerate(ttfts)
    ]
    requests.append(req(ok=False, error="HTTP 500: boom"))
    requests.append(req(cancelled=True))
    s = summarize(requests, seconds=5.0)
    assert s.requests == 6  # the cancelled one is neither a result nor an error
    assert s.errors == 1
    assert s.tokens == 55
    assert s.agg_tps == pytest.approx(55 / 5.0)
    assert s.ttft_avg_ms == pytest.approx(400.0)
    assert s.ttft_p95_ms == pytest.approx(percentile([t * 1000 for t in ttfts], 95))
    assert s.ttft_p95_ms == pytest.approx(400 + 0.8 * 600)  # rank 3.8 between 400 and 1000
    assert s.decode_tps_avg == pytest.approx(30.0)
    assert s.e2e_p95_ms == pytest.approx(5800.0)
    assert (s.drafted, s.accepted, s.acceptance) == (60, 30, 0.5)
    assert s.speculated == 5
    assert s.error_rate == pytest.approx(1 / 6)


def test_summary_of_nothing_has_no_figures() -> None:
    s = summarize([req(ok=False, error="x")], seconds=1.0)
    assert (s.ttft_avg_ms, s.agg_tps, s.decode_tps_avg, s.acceptance) == (None,) * 4


def test_lanes_and_rules_are_counted_from_the_headers() -> None:
    requests = [
        req("auto", lane="speculative", decision="preset=none,spec-lane-free->speculative"),
        req("auto", lane="batching", decision="preset=none,spec-lane-busy->batching"),
        req("auto", lane="batching", decision="preset=none,load-high->batching,clamped=n"),
    ]
    s = summarize(requests, 1.0)
    assert s.lanes == {"speculative": 1, "batching": 2}
    assert s.rules == {"spec-lane-free": 1, "spec-lane-busy": 1, "load-high": 1}


@pytest.mark.parametrize(
    ("decision", "rule"),
    [
        ("override->speculative", "override"),
        ("preset=interactive,short-output->batching", "short-output"),
        (None, "unknown"),
        ("garbage", "unknown"),
    ],
)
def test_rule_of(decision: str | None, rule: str) -> None:
    assert rule_of(decision) == rule


def test_pooled_sums_tokens_and_time_over_cells() -> None:
    runs = [
        uniform("batching", "chat", 2, ttft=0.1, tps=10, agg=20.0),
        uniform("batching", "code", 2, ttft=0.3, tps=20, agg=40.0),
        uniform("batching", "code", 4, ttft=0.3, tps=20, agg=80.0),
    ]
    s = pooled(runs, "batching", concurrency=2)
    assert s is not None
    # 22 tokens in 1.1 s + 22 tokens in 0.55 s
    assert s.agg_tps == pytest.approx(44 / 1.65)
    assert s.ttft_avg_ms == pytest.approx(200.0)
    assert pooled(runs, "spec-on") is None
    only_code = pooled(runs, "batching", families=["code"])
    assert only_code is not None and only_code.requests == 6


def test_a_shared_pair_pools_the_families_with_a_result_on_both_sides() -> None:
    runs = [
        uniform("spec-on", "chat", 1, ttft=0.1, tps=10, agg=10),
        uniform("spec-on", "code", 1, ttft=0.1, tps=20, agg=10),
        uniform("spec-off", "code", 1, ttft=0.1, tps=10, agg=10),
        cell("spec-off", "chat", 1, [req(ok=False, error="x")], 1.0),
    ]
    on, off = shared_pair(runs, "spec-on", "spec-off", 1)
    assert on is not None and off is not None
    assert (on.requests, on.decode_tps_avg, off.requests) == (1, pytest.approx(20.0), 1)
    assert shared_pair(runs, "spec-on", "batching", 1) == (None, None)


def test_records_survive_json() -> None:
    run = uniform("spec-on", "list", 2, ttft=0.2, tps=5, agg=7)
    again = CellRun.from_json(run.to_json())
    assert again == run
    m = run.measurements[0]
    assert load(Measurement, m.to_json()).decode_tps == pytest.approx(5.0)
