"""``speclane bench lanes``' ratios and table, and the one-thread shared target's config."""

from __future__ import annotations

from typing import Any

from router.bench.common.procs import LaneOptions, lanes_config
from router.bench.lanes.report import SHARED_ONE_THREAD, TARGETS, ratios, render


def result(pss_mib: int, aggregate: float) -> dict[str, Any]:
    return {
        "memory": {"pss_bytes": pss_mib << 20, "processes": 1},
        "mixed": {
            "interactive_ttft_s": 1.0,
            "interactive_tok_s": 3.0,
            "aggregate_tok_s": aggregate,
        },
        "turn2plus_ttft_s": {"alternating": 0.5, "one_lane": 0.5},
    }


def test_both_shared_targets_are_compared_with_separate() -> None:
    results = {
        "shared": result(1100, 9.0),
        SHARED_ONE_THREAD: result(1100, 6.0),
        "separate": result(1800, 10.0),
        "mlx_lm.server": result(1000, 7.0),
    }
    assert list(results) == list(TARGETS)
    r = ratios(results)
    assert r["shared_vs_separate_aggregate_tok_s"] == 0.9
    assert r["shared_1thread_vs_separate_aggregate_tok_s"] == 0.6
    assert r["goals_met"]["shared_throughput>=0.85x"] is True
    table = render({"results": results, "ratios": r})
    assert f"| {SHARED_ONE_THREAD} |" in table and "one thread taking turns: 0.60" in table


def test_a_target_with_one_shared_thread_says_so_in_its_config() -> None:
    config = lanes_config(LaneOptions(layout="shared", shared_threads=1))
    assert 'layout = "shared"' in config and "shared_threads = 1" in config
    assert "shared_threads" not in lanes_config(LaneOptions(layout="shared"))
