"""``speclane bench cold``'s summary and Markdown, from synthetic rounds (pure, no model)."""

from __future__ import annotations

from typing import Any

import pytest

from router.bench.cold.report import markdown, summary, table


def ours(n: int, mode: str = "startup", **extra: Any) -> dict[str, Any]:
    return {
        "round": n,
        "side": "speclane",
        "mode": mode,
        "startup_s": 8.0 + n,
        "startup_first_token_s": 9.0 + n,
        "warm_ttft_s": [0.5, 0.7],
        "overhead_ms": [0.3, 0.5],
        "errors": [],
        **extra,
    }


def theirs(n: int, **extra: Any) -> dict[str, Any]:
    return {
        "round": n,
        "side": "mlx_lm.server",
        "first_token_s": 4.0 + n,
        "warm_ttft_s": [0.4, 0.6],
        "errors": [],
        **extra,
    }


def report(mode: str, rounds: list[dict[str, Any]]) -> dict[str, Any]:
    return {
        "date": "2026-11-26T06:45:00+00:00",
        "commit": "abc1234",
        "mode": mode,
        "rounds": 2,
        "model": "/m/SmolLM2-135M-Instruct",
        "layout": "auto",
        "max_tokens": 8,
        "warm": 2,
        "environment": {
            "versions": {"speclane": "0.1.0", "mlx": "0.32.4", "mlx-lm": None},
            "hardware": {"cpu": "AMD EPYC", "cpus": 2, "memory_gib": 23.5, "mlx_device": "cpu"},
            "load_average_before": [1.0, 1.0, 1.0],
            "load_average_after": [2.0, 1.5, 1.0],
        },
        "rounds_detail": rounds,
        "summary": summary(rounds),
    }


def test_startup_mode_compares_start_up_to_first_token() -> None:
    s = summary([ours(1), theirs(1), theirs(2), ours(2)])
    assert s["speclane_cold_s"] == {"median": 10.5, "min": 10.0, "max": 11.0, "n": 2}
    assert s["mlx_lm_server_cold_s"]["median"] == 5.5
    assert s["cold_ratio"] == pytest.approx(10.5 / 5.5)
    assert s["speclane_on_demand_first_token_s"]["median"] is None
    assert s["speclane_warm_ttft_s"]["median"] == pytest.approx(0.6)
    assert s["warm_ttft_difference_ms"] == pytest.approx(100.0)
    assert s["router_overhead_ms"]["median"] == pytest.approx(0.4)
    assert s["errors"] == []


def test_on_demand_mode_compares_an_unloaded_models_first_request() -> None:
    rounds = [ours(1, "on-demand", on_demand_first_token_s=3.0), theirs(1)]
    rounds += [ours(2, "on-demand", on_demand_first_token_s=4.0), theirs(2)]
    s = summary(rounds)
    assert s["speclane_cold_s"]["median"] == 3.5
    assert s["speclane_startup_first_token_s"]["median"] == 10.5
    assert s["cold_ratio"] == pytest.approx(3.5 / 5.5)
    text = table(report("on-demand", rounds))
    assert "an unloaded model's first request" in text
    assert "| 3.50 (3.00-4.00) | 5.50 (5.00-6.00) | 0.64 |" in text
    assert "on the model loaded at start (s) | 10.50 (10.00-11.00)" in text


def test_a_failed_round_is_left_out_of_the_figures_and_named() -> None:
    failed = ours(2, startup_first_token_s=None, warm_ttft_s=[], errors=["HTTP 503: loading"])
    s = summary([ours(1), theirs(1), failed, theirs(2)])
    assert s["speclane_cold_s"] == {"median": 10.0, "min": 10.0, "max": 10.0, "n": 1}
    assert s["errors"] == ["round 2 speclane: HTTP 503: loading"]


def test_the_markdown_says_when_where_and_on_what() -> None:
    text = markdown(report("startup", [ours(1), theirs(1), theirs(2), ours(2)]))
    assert "2026-11-26T06:45:00+00:00, commit abc1234, mode `startup`" in text
    assert "load average before [1.0, 1.0, 1.0], after [2.0, 1.5, 1.0]" in text
    assert "mlx 0.32.4" in text and "mlx-lm None" not in text
    assert "| cold start to first token (s): process start, load, first request | 10.50" in text
    assert "| 2 | mlx_lm.server | 6.00 |" in text
    assert "Warm TTFT, speclane minus mlx_lm.server: 100.0 ms" in text
    assert "Errors" not in text
