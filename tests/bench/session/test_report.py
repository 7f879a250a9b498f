"""The session benchmark's pure parts: the sessions it sends and what a run says (the run
itself is a benchmark, not a test)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from router.bench.session.report import fmt_turn, render, summarise
from router.bench.session.run import (
    FIXED_SOURCES,
    TARGETS,
    fixed_client,
    lane_client,
    router_targets,
    session_policies,
)
from router.bench.session.script import FILE, FILE_NAME, SESSIONS
from router.config.policies.files import parse_policies


def rows(seconds: list[float], texts: list[str] | None = None) -> list[dict[str, Any]]:
    texts = texts or [f"answer {i}" for i in range(len(seconds))]
    return [
        {
            "turn": i + 1,
            "kind": "whole",
            "seconds": s,
            "ttft_s": 0.5,
            "completion_tokens": 100,
            "text": t,
            "error": None,
        }
        for i, (s, t) in enumerate(zip(seconds, texts, strict=True))
    ]


def test_the_sessions_edit_one_file_in_several_formats_and_retry() -> None:
    assert FILE.count("\n") >= 35 and FILE_NAME in SESSIONS["whole"].turns[0].ask
    for name in ("whole", "mixed"):
        kinds = [t.kind for t in SESSIONS[name].turns]
        assert "question" in kinds and kinds[-1] == "retry"
    assert {"search_replace", "diff", "whole"} <= {t.kind for t in SESSIONS["mixed"].turns}
    assert all("```" not in t.ask for t in SESSIONS["chat"].turns)  # nothing to copy


def test_summary_and_goals_of_an_editing_session() -> None:
    results = {
        "mixed": {
            "mlx_lm.server": rows([20.0, 20.0, 10.0]),
            "speclane": rows([8.0, 8.0, 10.5]),
            "speclane:prompt_lookup": rows([8.0, 9.0, 10.0]),
            "speclane:suffix": rows([15.0, 15.0, 10.0], ["answer 0", "other", "answer 2"]),
        }
    }
    summary = summarise(results)["mixed"]
    per = summary["targets"]
    assert per["speclane"]["vs_mlx_lm_server"] == pytest.approx(26.5 / 50.0)
    assert per["speclane:suffix"]["outputs_equal_plain"] == [True, False, True]
    goals = summary["goals"]
    assert goals["best_fixed"] == "speclane:prompt_lookup"
    assert goals["within_10%_of_best_fixed"] is True
    assert goals["beats_every_fixed"] is True  # 26.5 < 27.0 and < 40.0
    assert goals["session<=0.5x"] is False  # 0.53x
    assert goals["no_turn_slower"] is True  # 10.5 is within 10 % of 10.0
    assert "mixed" in render({"results": results, "summary": summarise(results)})


def test_a_turn_slower_than_plain_beyond_the_slack_is_named() -> None:
    results = {"whole": {"mlx_lm.server": rows([10.0, 10.0]), "speclane": rows([5.0, 12.0])}}
    goals = summarise(results)["whole"]["goals"]
    assert goals["turns_slower_than_mlx_lm_server"] == [2]
    assert goals["no_turn_slower"] is False


def test_a_chat_session_is_judged_by_its_speed_against_plain() -> None:
    results = {"chat": {"mlx_lm.server": rows([10.0]), "speclane": rows([10.4])}}
    goals = summarise(results)["chat"]["goals"]
    assert goals["chat_speed_vs_plain"] == pytest.approx(10.0 / 10.4)
    assert goals["chat>=0.95x"] is True


def test_fmt_turn_names_each_source() -> None:
    row = rows([2.0])[0] | {"sources": {"prompt_lookup": {"accepted": 40, "drafted": 48}}}
    assert "prompt_lookup 40/48" in fmt_turn(row)


def test_each_fixed_source_is_a_client_of_its_own_without_auto_disable() -> None:
    files = {name: text.encode() for name, text in session_policies().items()}
    loaded = parse_policies(Path("policies"), files)
    clients = {p.client: p for p in loaded.policies}
    for source in FIXED_SOURCES:
        assert f"speclane:{source}" in TARGETS
        assert clients[fixed_client(source)].spec.enabled is False


def test_each_target_held_on_a_lane_is_a_client_of_its_own_that_may_name_it() -> None:
    """Its own key, so its prompt cache and suffix index are not ``speclane``'s (run before
    it on the same router, with the same answers); a policy that lets it hold the lane."""
    from router.config.names import LANE_HEADER, LANE_NAMES
    from router.config.policies.identity import bearer_token

    files = {name: text.encode() for name, text in session_policies().items()}
    policies = parse_policies(Path("policies"), files)
    clients = {p.client: p for p in policies.policies}
    targets = {t.name: t for t in router_targets("http://x", "m")}
    keys = [bearer_token(t.headers.get("Authorization")) for t in targets.values()]
    assert keys[0] is None and None not in keys[1:] and len(set(keys)) == len(keys)
    for lane in LANE_NAMES:
        target = targets[f"speclane@{lane}"]
        assert target.headers[LANE_HEADER] == lane
        policy = clients[lane_client(lane)]
        assert policy.allow_lane_override and policy.spec.enabled is not False


def test_each_agent_edits_a_file_of_its_own() -> None:
    from router.bench.session.script import for_agent

    whole = SESSIONS["whole"]
    assert for_agent(whole, 0) is whole
    first, second = for_agent(whole, 1), for_agent(whole, 2)
    assert "class Inventory1" in first.turns[0].ask and "class Item2" in second.turns[0].ask
    assert "inventory1.py" in first.turns[0].ask
    assert [t.kind for t in first.turns] == [t.kind for t in whole.turns]
    assert first.turns[0].ask != second.turns[0].ask


def test_agents_at_once_are_judged_by_their_makespan() -> None:
    from router.bench.session.report import summarise_agents

    def run(makespan: float, texts: list[str]) -> dict[str, Any]:
        return {"makespan_s": makespan, "agents": [rows([1.0, 2.0], texts) for _ in range(3)]}

    same = ["a", "b"]
    results = {
        "whole": {"mlx_lm.server": run(80.0, same), "speclane": run(36.0, same)},
        "chat": {"mlx_lm.server": run(30.0, same), "speclane": run(34.0, ["a", "c"])},
    }
    summary = summarise_agents(results)
    whole = summary["whole"]
    assert whole["targets"]["speclane"]["vs_mlx_lm_server"] == pytest.approx(0.45)
    assert whole["targets"]["speclane"]["agent_seconds"] == [3.0, 3.0, 3.0]
    assert whole["targets"]["speclane"]["agents_equal_plain"] == [True, True, True]
    assert whole["goals"] == {"makespan<=0.5x": True, "same_tokens": True}
    chat = summary["chat"]
    assert chat["goals"]["chat_no_slower"] is False  # 34/30 is past the slack
    assert chat["targets"]["speclane"]["agents_equal_plain"] == [False, False, False]
    text = render({"settings": {"agents": 3}, "summary": summary})
    assert "3 agents at once" in text and "0.45" in text
