"""router.routing.pace: each lane's measured pace, and where a turn finishes first."""

from __future__ import annotations

from typing import Any

import pytest

from router.config.policies import Policy
from router.config.presets import DEFAULT_PRESETS
from router.routing.classify import RequestFacts, RoutingRules, classify
from router.routing.pace import (
    DEFAULT_OUTPUT,
    MIN_TOKENS,
    RULE,
    LaneLoad,
    LanePace,
    PaceBook,
    Paces,
    Turn,
    compare,
    expected_seconds,
    rows_key,
)
from router.routing.types import BackendView, RouteRequest

MODEL = "m"


def test_the_book_averages_each_lane_and_row_count_apart() -> None:
    book = PaceBook()
    book.decoded("batching", 2.2, 100, 20.0)  # 0.2 s per token at two rows
    book.decoded("batching", 1.0, 100, 10.0)
    book.decoded("speculative", 1.0, 100, 5.0)
    book.decoded("speculative", 1.0, MIN_TOKENS - 1, 100.0)  # too short to say anything
    book.started("batching", "held", 1.5, 4000)
    book.started("speculative", "cold", 8.0, 4000)
    book.started("speculative", "moved", 2.0, 4000)
    paces = book.snapshot()
    assert paces.lanes["batching"].per_token == {2: 0.2, 1: 0.1}
    assert paces.lanes["speculative"].per_token == {1: 0.05}
    assert paces.lanes["batching"].held_s == 1.5
    assert paces.lanes["speculative"].cold_s_per_char == pytest.approx(0.002)
    assert paces.lanes["speculative"].moved_s_per_char == pytest.approx(0.0005)
    assert paces.output_tokens is not None and 0 < paces.output_tokens <= 100


def test_new_observations_move_the_average_and_renew_the_snapshot() -> None:
    book = PaceBook()
    book.decoded("batching", 1, 100, 10.0)
    first = book.snapshot()
    assert book.snapshot() is first  # nothing new: the same value
    book.decoded("batching", 1, 100, 20.0)
    second = book.snapshot()
    assert second is not first
    assert 0.1 < second.lanes["batching"].per_token[1] < 0.2  # weighted, not replaced


def test_rows_are_bucketed_and_an_unmeasured_bucket_is_scaled_from_the_nearest() -> None:
    assert [rows_key(r) for r in (0.2, 1.4, 1.6, 30)] == [1, 1, 2, 8]
    pace = LanePace(per_token={1: 0.1})
    assert pace.decode(1) == 0.1
    assert pace.decode(3) == pytest.approx(0.3)  # a row's share of each pass: at most 1/3
    assert LanePace().decode(1) is None


def test_a_move_is_priced_as_a_held_turn_until_one_is_measured() -> None:
    pace = LanePace(per_token={1: 0.1}, held_s=0.5, cold_s_per_char=0.01)
    assert pace.first_token("moved", 1000) == pytest.approx(0.5)
    assert pace.first_token("cold", 1000) == pytest.approx(10.0)
    measured = LanePace(per_token={1: 0.1}, held_s=0.5, moved_s_per_char=0.001)
    assert measured.first_token("moved", 1000) == pytest.approx(1.0)
    assert LanePace(held_s=0.5).first_token("held", 10**6) == 0.5  # held: the new part only


def test_expected_seconds_counts_the_first_token_the_decode_and_the_wait() -> None:
    pace = LanePace(per_token={1: 0.1, 2: 0.15}, held_s=1.0)
    turn = Turn(prompt_chars=4000, output_tokens=100)
    assert expected_seconds(pace, "held", 2, 0, turn) == pytest.approx(1.0 + 15.0)
    # one request ahead (a lane at capacity): half a turn more, on average
    assert expected_seconds(pace, "held", 1, 1, turn) == pytest.approx(1.0 + 10.0 * 1.5)
    assert expected_seconds(pace, "cold", 1, 0, turn) is None  # no cold figure


def test_expected_output_is_the_typical_answer_within_max_tokens() -> None:
    assert Paces().expected_output(None) == DEFAULT_OUTPUT
    assert Paces(output_tokens=150).expected_output(100) == 100
    assert Paces(output_tokens=150).expected_output(4000) == 150


def paces(spec_per_token: float, batch_per_token: float, moved: float = 0.0005) -> Paces:
    return Paces(
        {
            "speculative": LanePace(
                per_token={1: spec_per_token}, held_s=0.5, moved_s_per_char=moved
            ),
            "batching": LanePace(
                per_token={1: batch_per_token / 2, 2: batch_per_token}, held_s=0.5
            ),
        },
        output_tokens=150,
    )


def test_compare_moves_a_turn_only_past_the_margin() -> None:
    holder, other = LaneLoad("batching", 1, 8), LaneLoad("speculative", 0, 1)
    turn = Turn(4000, 150)
    fast = compare(holder, other, paces(0.08, 0.2), turn, margin=0.15)
    assert fast is not None and fast.moves and fast.other_s < fast.holder_s
    assert "held=" in fast.label()
    # about as fast on either lane: the cache wins
    near = compare(holder, other, paces(0.18, 0.2), turn, margin=0.15)
    assert near is not None and not near.moves
    # an expensive move (a full prefill) outweighs a faster decode
    costly = compare(holder, other, paces(0.1, 0.2, moved=0.01), turn, margin=0.15)
    assert costly is not None and not costly.moves
    assert compare(holder, other, Paces(), turn, margin=0.15) is None  # nothing measured


def lane(name: str, inflight: int = 0, capacity: int = 1, **kw: Any) -> BackendView:
    return BackendView(
        name=name,
        lane=name,  # type: ignore[arg-type]
        models=frozenset({MODEL}),
        ready=True,
        cooled_down=False,
        inflight=inflight,
        capacity=capacity,
        **kw,
    )


def route(
    holder: str | None,
    measured: Paces | None,
    rules: RoutingRules | None = None,
    batch_inflight: int = 1,
) -> tuple[str, str, str]:
    views = (
        lane("speculative", speculative=True),
        lane("batching", inflight=batch_inflight, capacity=8),
    )
    facts = RequestFacts(
        RouteRequest("chat", MODEL, max_tokens=200, prompt_chars=4000), cache_holder=holder
    )
    result = classify(
        facts,
        Policy(client="c"),
        DEFAULT_PRESETS,
        views,
        rules=rules or RoutingRules(),
        paces=measured,
    )
    decision = result.decision
    return decision.candidates[0].lane, decision.labels["rule"], decision.labels["pace"]


def test_a_turn_leaves_a_shared_batch_for_the_free_lane_when_it_finishes_sooner_there() -> None:
    lane_, rule, label = route("batching", paces(0.08, 0.2))
    assert (lane_, rule) == ("speculative", RULE)
    assert label.startswith("held=")
    # the batching lane would be as quick: affinity holds
    assert route("batching", paces(0.19, 0.2))[:2] == ("batching", "cache-affinity")
    # nothing measured, or placement off: affinity alone
    assert route("batching", None)[:2] == ("batching", "cache-affinity")
    assert route("batching", Paces())[:2] == ("batching", "cache-affinity")
    off = RoutingRules(pace_placement=False)
    assert route("batching", paces(0.08, 0.2), off)[:2] == ("batching", "cache-affinity")
    # no holder: the load rules alone, nothing to compare
    assert route(None, paces(0.08, 0.2)) == ("speculative", "spec-lane-free", "")


def test_a_turn_held_by_a_busy_speculative_lane_goes_where_it_starts_sooner() -> None:
    views = (
        lane("speculative", inflight=1, speculative=True),
        lane("batching", capacity=8),
    )
    facts = RequestFacts(
        RouteRequest("chat", MODEL, max_tokens=200, prompt_chars=4000),
        cache_holder="speculative",
    )
    measured = Paces(
        {
            "speculative": LanePace(per_token={1: 0.1}, held_s=0.5),
            "batching": LanePace(per_token={1: 0.1}, held_s=0.5, moved_s_per_char=0.0002),
        },
        output_tokens=150,
    )
    result = classify(facts, Policy(client="c"), DEFAULT_PRESETS, views, paces=measured)
    assert result.decision.candidates[0].lane == "batching"
    assert result.decision.labels["rule"] == RULE
    without = classify(facts, Policy(client="c"), DEFAULT_PRESETS, views)
    assert without.decision.labels["rule"] == "cache-affinity"  # waits behind the other


def test_the_margin_is_validated() -> None:
    with pytest.raises(ValueError):
        RoutingRules(pace_margin=1.0)
    with pytest.raises(ValueError):
        RoutingRules(pace_margin=-0.1)
