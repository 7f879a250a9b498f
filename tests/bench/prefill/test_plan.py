"""``speclane bench prefill``'s requests: the programs' bodies in order, cut where the server
restarts or the model is unloaded, each turn extending the one it follows."""

from __future__ import annotations

from typing import Any

from router.bench.prefill import convert, plan, shapes


def test_the_restart_and_the_unload_cut_the_steps_into_stages() -> None:
    stages = plan.stages(plan.steps())
    assert [(before, len(stage)) for before, stage in stages] == [
        ("", 12),
        ("restart", 1),
        ("unload", 1),
    ]
    doors = {s.name.split(":")[0]: s.door for s in plan.steps()}
    assert doors == {"claude-code": "anthropic", "qwen-code": "chat", "codex": "responses"}


class NoToolsTokenizer:
    has_tool_calling = False


def test_every_step_that_follows_another_repeats_its_prompt() -> None:
    """As the lane renders it (the programs' JSON differs: Claude Code sends its environment
    block as a text part first, as a string later)."""
    steps = {s.name: s for s in plan.steps()}
    for step in steps.values():
        if step.follows is None:
            continue

        def rendered(s: plan.Step) -> list[dict[str, Any]]:
            body = shapes.with_max_tokens(s.body, 8)
            messages: list[dict[str, Any]] = convert.for_mlx_lm(
                s.door, body, NoToolsTokenizer(), "m"
            )["messages"]
            return messages

        earlier, later = rendered(steps[step.follows]), rendered(step)
        if step.name == "qwen-code: turn 2":  # Qwen Code drops turn 1's date reminder
            assert later[0] == earlier[0] and later[1] != earlier[1]
            continue
        assert later[: len(earlier)] == earlier, step.name
        assert len(later) > len(earlier)


def test_the_goals_are_the_issues() -> None:
    goals = {s.name: s.goal for s in plan.steps() if s.goal is not None}
    assert goals["claude-code: a second session"] == plan.Goal("cached_share", share=0.85)
    assert goals["qwen-code: turn 2"] == plan.Goal("near_ideal", slack=50)
    resumed = [s for s in plan.steps() if s.before]
    assert all(s.goal == plan.RESUMED for s in resumed)
    assert plan.RESUMED.text() == ">= 80% cached, TTFT <= 0.2x cold"


def test_the_ideal_is_what_a_step_adds() -> None:
    assert plan.ideal(2100, 2000) == 100
    assert plan.ideal(2100, None) is None
    assert plan.ideal(10, 2000) == 0
