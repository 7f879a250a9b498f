"""The draft-source benchmark's figures, table and goals (pure)."""

from __future__ import annotations

from typing import Any

import pytest

from router.bench.sources import report as sources


def row(
    source: str,
    state: str = "on",
    judging: bool = True,
    samples: int = 3,
    baseline: float | None = 10.0,
    client: str = "family-chat",
) -> dict[str, Any]:
    return {
        "backend": "speculative",
        "workload": f"{client}:none:chat",
        "source": source,
        "state": state,
        "reason": state,
        "window": {"judging": judging},
        "speed": {"spec_samples": samples, "min_samples": 3, "baseline_tps": baseline},
    }


@pytest.mark.parametrize(
    ("r", "expected"),
    [
        (row("draft_model"), True),
        (row("draft_model", state="off", judging=False, samples=0), False),
        (row("draft_model", judging=False), False),
        (row("draft_model", samples=2), False),
        (row("draft_model", baseline=None), False),
    ],
)
def test_a_source_settles_once_it_stayed_on_fully_judged(r: dict[str, Any], expected: bool) -> None:
    assert sources.settled([r], "draft_model", "speculative") is expected


def test_settled_once_the_source_in_use_decided_to_stay_on_or_every_source_is_off() -> None:
    rows = [row("draft_model", state="off"), row("prompt_lookup", judging=False)]
    assert not sources.settled(rows, "draft_model", "speculative")  # the cascade moves on
    assert not sources.settled(rows, "prompt_lookup", "speculative")  # still judging
    assert sources.settled([*rows[:1], row("prompt_lookup")], "prompt_lookup", "speculative")
    assert not sources.settled(rows, None, "speculative")  # a plain baseline sample
    assert sources.settled(rows, None, "batching")  # every source off: decoded plainly
    assert not sources.settled([], "suffix", "speculative")  # nothing judged yet


def test_a_lane_choosing_per_step_settles_on_the_row_the_router_keyed() -> None:
    """A request with a ``prediction``: the router keys the workload ``prediction``, the lane
    reports ``auto`` (it chose at every step); the prediction's row is the decision."""
    assert sources.settled([row("prediction")], "auto", "speculative")
    assert not sources.settled([row("prediction", judging=False)], "auto", "speculative")
    assert not sources.settled([row("prediction")], "suffix", "speculative")


def test_family_rows_keep_the_speculative_lane_rows_of_that_client() -> None:
    state = {
        "workloads": [
            row("draft_model"),
            row("draft_model", client="family-edit"),
            {**row("draft_model"), "backend": "batching"},
        ]
    }
    assert sources.family_rows(state, "chat") == [row("draft_model")]


def run(
    tps: float | None,
    tokens: int = 10,
    source: str | None = None,
    drafted: int = 0,
    accepted: int = 0,
    lane: str = "speculative",
) -> dict[str, Any]:
    spec = {"source": source, "drafted": drafted, "accepted": accepted} if source else None
    return {"tps": tps, "tokens": tokens, "spec": spec, "lane": lane}


def test_summaries_and_aggregates() -> None:
    s = sources.summarise(
        [
            run(10.0, source="prompt_lookup", drafted=8, accepted=6),
            run(20.0, source="prompt_lookup", drafted=2, accepted=0),
        ]
    )
    assert s["tps"] == 15.0 and s["acceptance"] == 0.6 and s["sources"] == ["prompt_lookup"]
    both = sources.together([run(10.0, tokens=30), run(10.0, tokens=30)], wall=4.0)
    assert both["aggregate_tps"] == 15.0 and both["acceptance"] is None


def results(routed_tps: float) -> dict[str, Any]:
    plain = sources.summarise([run(10.0)])
    cell = sources.together([run(10.0), run(10.0)], 2.0)
    return {
        "edit": {
            "c1": {"plain": plain, "prompt_lookup": sources.summarise([run(16.0)])},
            "c2": {"plain": cell, "prompt_lookup": cell},
            "c2_batching": cell,
            "routed": sources.summarise([run(16.0)]),
            "routed_c2": cell,
            "auto_disable": [row("prompt_lookup")],
            "plain_beside_routed": sources.summarise([run(8.0)]),
        },
        "refactor-with-prediction": {
            "c1": {"plain": plain, "prediction": sources.summarise([run(25.0)])},
            "c2": {},
            "routed": sources.summarise([run(routed_tps)]),
        },
    }


def test_goals_are_ratios_of_the_run() -> None:
    g = sources.goals(results(routed_tps=9.0))
    assert g["prediction_on_edits"] == 2.5 and g["prompt_lookup_on_edits"] == 1.6
    assert g["met"] == {
        "prediction>=2.0": True,
        "prompt_lookup>=1.5": True,
        "routed>=0.95 everywhere": False,
    }
    assert sources.goals(results(routed_tps=9.5))["met"]["routed>=0.95 everywhere"]
    # Routed requests are judged against the plain ones sent between them, when measured.
    assert g["routed_over_plain"] == {"edit": 2.0, "refactor-with-prediction": 0.9}


def test_the_table_has_a_row_per_variant_and_a_routed_row() -> None:
    lines = sources.table(results(routed_tps=20.0)).split("\n")
    assert len(lines) == 2 + 3 + 3
    assert lines[3].startswith("| edit | prompt_lookup | - | 16.0 | 1.60 |")
    assert "**routed**" in lines[4] and "prompt_lookup: on (on)" in lines[4]


def test_scenario_goals_and_table() -> None:
    cell = {"tps": 10.0, "acceptance": None, "accepted": 0, "drafted": 0}
    results = {
        "repeat": {"plain": cell, "suffix": {**cell, "tps": 25.0}},
        "tool-call": {"plain": cell, "forced": {**cell, "tps": 12.0, "forced": 9}},
    }
    goals = sources.scenario_goals(results)
    assert goals["met"] == {"repeat>=2.0": True, "tool_call>=1.3": False, "json_schema>=1.3": None}
    assert "| tool-call | forced | - | 9 | 12.0 | 1.20 |" in sources.scenario_table(results)
