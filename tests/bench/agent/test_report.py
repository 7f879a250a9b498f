"""The agent benchmark's pure measurements (the run itself is a benchmark, not a test)."""

from __future__ import annotations

import pytest

from router.bench.agent.report import largest_gap, ratios, render
from router.bench.common.stats import ratio
from router.bench.common.workload import AGENT, long_document, system_prompt


def test_largest_gap_counts_waits_overlapping_the_window_whole() -> None:
    times = [0.0, 0.5, 1.0, 4.0, 4.2, 9.0]
    assert largest_gap(times, 1.5, 4.1) == 3.0  # 1.0 -> 4.0 began before the window
    assert largest_gap(times, 4.1, 4.15) == pytest.approx(0.2)
    assert largest_gap(times, 4.3, 20.0) == pytest.approx(4.8)  # 4.2 -> 9.0 ends after the window
    assert largest_gap(times, 10.0, 11.0) is None
    assert largest_gap([], 0.0, 1.0) is None


def test_ratios_and_goals() -> None:
    def result(ttfts: list[float], tps: float, gap: float | None) -> dict[str, object]:
        turn = {"decode_tok_s": 1.0, "prompt_tokens": 1, "cached_tokens": 0}
        starvation = {"largest_gap_s": gap, "long_prompt_tokens": 1}
        return {
            "turns": [{"turn": i + 1, "ttft_s": t, **turn} for i, t in enumerate(ttfts)],
            "throughput": {"aggregate_tok_s": tps, "concurrency": 4},
            "starvation": {**starvation, "short_tokens_during_prefill": 3},
        }

    results = {
        "speclane": result([30.0, 1.0, 3.0], 12.0, 1.5),
        "mlx_lm.server": result([20.0, 2.0, 2.0], 10.0, 9.0),
    }
    out = ratios(results)
    assert out["turn2plus_ttft"] == 1.0  # turn 1 (no cache anywhere) is left out
    assert out["aggregate_throughput"] == pytest.approx(1.2)
    assert out["goals_met"] == {
        "turn2plus_ttft<=1.0": True,
        "aggregate_throughput>=1.0": True,
        "largest_gap<2s": True,
    }
    assert ratio(1.0, 0.0) is None and ratio(None, 1.0) is None
    text = render({"results": results, "ratios": out})
    assert "| speclane | 2 | 1.00 |" in text and "largest gap 1.50s" in text


def test_prompts_have_about_the_asked_size_and_are_deterministic() -> None:
    assert system_prompt(1000, AGENT) == system_prompt(1000, AGENT)
    assert 3500 < len(system_prompt(1000, AGENT)) < 5000
    assert long_document(500, "a") != long_document(500, "b")
