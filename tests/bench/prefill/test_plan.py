"""``speclane bench prefill``'s requests: the steps, the restart, the conversations."""

from __future__ import annotations

from router.bench.prefill import plan


def test_the_restart_cuts_the_steps_into_two_server_starts() -> None:
    steps = plan.steps(plan.source_file(3))
    stages = plan.stages(steps)
    assert [[s.name for s in stage] for stage in stages] == [
        ["first", "next-turn", "new-conversation"],
        ["after-restart", "new-conversation-after-restart"],
    ]
    assert [s.conversation for s in steps] == ["a", "a", "b", "a", "c"]


def test_a_turn_appends_to_its_conversation() -> None:
    system = plan.system_prompt(2)
    first = plan.messages(system, [], "q1")
    second = plan.messages(system, [("q1", "a1")], "q2")
    assert second[: len(first)] == first and second[len(first) :] == [
        {"role": "assistant", "content": "a1"},
        {"role": "user", "content": "q2"},
    ]
    assert "Rule 1:" in system and "Rule 2:" not in system


def test_the_ideal_is_what_a_continuing_turn_adds() -> None:
    assert plan.ideal(2100, 2000, 8) == 92
    assert plan.ideal(2100, None, 0) is None
    assert plan.ideal(10, 2000, 8) == 0
