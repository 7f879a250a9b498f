"""``speclane bench prefill``'s table and goals, from synthetic records."""

from __future__ import annotations

import dataclasses
from typing import Any

from router.bench.prefill import plan, report


def goal(g: plan.Goal) -> dict[str, Any]:
    return {**dataclasses.asdict(g), "text": g.text()}


def row(step: str, prompt: int, cached: int, ttft: float, **extra: Any) -> dict[str, Any]:
    return {
        "step": step,
        "prompt_tokens": prompt,
        "cached_tokens": cached,
        "prefilled_tokens": prompt - cached,
        "ttft_s": ttft,
        **extra,
    }


RESTART = "claude-code: next turn after a restart"
RESULTS = {
    "date": "2026-12-02T05:30:00Z",
    "commit": "abc1234",
    "model": "m",
    "environment": {"load_average_before": [3.0], "load_average_after": [4.0]},
    "targets": {
        "speclane": [
            row("a second session", 2000, 1800, 1.5, goal=goal(plan.SECOND_SESSION)),
            row("turn 2", 2100, 2000, 0.5, ideal_new_tokens=60, goal=goal(plan.TOOL_LOOP)),
            row(RESTART, 2651, 2633, 0.91, before="restart", goal=goal(plan.RESUMED)),
            {"step": "after an unload", "error": "unload and load: RuntimeError: stuck"},
        ],
        "mlx_lm.server": [
            row("a second session", 2000, 30, 15.0, goal=goal(plan.SECOND_SESSION)),
            row("turn 2", 2100, 900, 9.0, ideal_new_tokens=60, goal=goal(plan.TOOL_LOOP)),
            row(RESTART, 2651, 0, 20.0, before="restart", goal=goal(plan.RESUMED)),
            {"error": "RuntimeError: did not start"},
        ],
    },
}


def test_each_goal_is_met_or_not_and_says_by_how_much() -> None:
    rows = {(r[0], r[1].split(" (")[0]): r for r in report.rows(RESULTS)}
    assert rows["speclane", "a second session"][-1] == ">= 85% cached: met (90%)"
    assert rows["mlx_lm.server", "a second session"][-1] == ">= 85% cached: NOT met (2%)"
    assert rows["speclane", "turn 2"][-1] == "<= ideal + 50: met (+40)"
    assert rows["mlx_lm.server", "turn 2"][-1] == "<= ideal + 50: NOT met (+1,140)"
    # the cold prefill of the same prompt: mlx_lm.server's, which read nothing cached
    assert rows["speclane", RESTART][-1].endswith(": met (99%, 0.05x)")
    assert rows["speclane", RESTART][1] == f"{RESTART} (restart)"
    assert rows["speclane", RESTART][3] == "2,633 (99%)"
    assert rows["mlx_lm.server", RESTART][-1].endswith("NOT met (0%, 1.00x)")


def test_a_failed_step_and_a_failed_target_say_so() -> None:
    text = report.render(RESULTS)
    assert "after an unload: unload and load: RuntimeError: stuck" in text
    assert "(failed)" in text and "did not start" in text
    md = report.markdown(RESULTS)
    assert "commit abc1234" in md and f"| speclane | {RESTART} (restart) | 2,651 |" in md
    assert "every line naming the date or the billing code kept" in md
