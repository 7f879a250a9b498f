"""router.worker.drafting.draftcontrol: each step's draft length from acceptance and pass cost."""

from __future__ import annotations

import pytest

from router.worker.drafting.draftcontrol import (
    PRIOR_BETA,
    Acceptance,
    CostProfile,
    PassCost,
    fit,
)


def test_expected_tokens_counts_the_targets_own_token() -> None:
    assert Acceptance((0.0, 1.0)).expected(8) == 1.0
    assert Acceptance((1.0, 0.0)).expected(4) == 5.0
    assert Acceptance((1.0, 1.0)).expected(2) == pytest.approx(1.75)


def test_acceptance_follows_the_latest_steps() -> None:
    a = Acceptance()
    start = a.alpha
    for _ in range(4):
        a.verified(8, 0)
    low = a.alpha
    assert low < 0.15 < start
    for _ in range(4):
        a.verified(8, 8)  # a copied span: every draft token kept
    assert a.alpha > 0.9


def test_acceptance_ignores_tokens_after_the_first_rejected_one() -> None:
    a, b = Acceptance(), Acceptance()
    a.verified(2, 1)
    b.verified(8, 1)
    assert a.alpha == b.alpha
    a.verified(0, 0)  # nothing drafted: nothing learned
    assert a.alpha == b.alpha


def test_pass_cost_is_measured_per_batch_size() -> None:
    cost = PassCost()
    assert cost.beta(1) == PRIOR_BETA
    cost.observe(1, 9, 0.3)  # nothing to compare a wide pass with yet
    assert cost.beta(1) == PRIOR_BETA and cost.needs_plain(1)
    cost.observe(1, 1, 0.1)
    assert not cost.needs_plain(1) and cost.needs_plain(4)
    cost.observe(1, 9, 0.26)  # 8 more positions cost 1.6 one-position passes
    assert cost.beta(1) == pytest.approx(0.2)
    assert cost.beta(4) == PRIOR_BETA
    cost.observe(4, 1, 0.1)
    cost.observe(4, 3, 0.1)  # no dearer than one position: free
    assert cost.beta(4) == 0.0
    assert cost.report() == {
        "draft_position_cost": {"1": 0.2, "4": 0.0},
        "draft_pass_jump": {"1": 0.0, "4": 0.0},
    }


def test_a_pass_costs_a_step_once_wider_then_each_position() -> None:
    """Timed as a CPU times them (one more position dearest, the rest alike): the profile
    finds the step and the cost per position, so a long draft is not overpriced."""
    cost = PassCost()
    cost.observe(1, 1, 0.100)
    for width, seconds in ((2, 0.118), (3, 0.126), (5, 0.142), (9, 0.174)):
        for _ in range(3):
            cost.observe(1, width, seconds)
    profile = cost.profile(1)
    assert profile.jump == pytest.approx(0.1, abs=0.01)
    assert profile.beta == pytest.approx(0.08, abs=0.005)
    assert profile.of(0) == 1.0
    assert profile.of(8) == pytest.approx(1.74, abs=0.02)
    # One figure per position (what a single width measures) would price 8 positions at 1.64
    # if measured at 8, or at 2.44 if measured at one position: the profile is neither.
    assert cost.report()["draft_pass_jump"] == {"1": pytest.approx(0.1, abs=0.01)}


def test_the_profile_never_prices_a_position_below_nothing() -> None:
    assert fit({}) is None
    assert fit({4: (0.4, 3)}) == CostProfile(0.1)  # one width: a cost per position alone
    falling = fit({1: (0.3, 3), 8: (0.1, 3)})  # noise: wider measured cheaper
    assert falling is not None and falling.beta == 0.0 and falling.jump == pytest.approx(0.2)
    steep = fit({1: (0.05, 3), 2: (0.3, 3)})  # through the origin, not below it
    assert steep is not None and steep.jump == 0.0 and steep.beta > 0


def test_pass_cost_fixed_by_the_setting() -> None:
    cost = PassCost(0.05)
    assert not cost.needs_plain(1)
    cost.observe(1, 1, 0.1)
    cost.observe(1, 9, 1.0)
    assert cost.beta(1) == 0.05
    assert cost.report() == {"draft_position_cost": 0.05}
    assert cost.profile(1) == CostProfile(0.05)
    with pytest.raises(ValueError, match="draft_position_cost"):
        PassCost(-1.0)


def test_pass_cost_is_the_median_of_recent_timings() -> None:
    """A pass that waited on another process (a busy machine) moves no figure."""
    cost = PassCost()
    for seconds in (0.1, 0.1, 2.5, 0.1):
        cost.observe(1, 1, seconds)
    assert cost.plain(1) == pytest.approx(0.1)
    for seconds in (0.15, 0.15, 3.0):
        cost.observe(1, 6, seconds)
    assert cost.beta(1) == pytest.approx(0.1)


def test_expected_tokens_per_position_follow_where_drafts_are_refused() -> None:
    """Refused at the third token every time: two kept for sure, the third never."""
    a = Acceptance()
    for _ in range(20):
        a.verified(6, 2)
    assert a.expected(2) == pytest.approx(3.0, abs=0.15)
    assert a.expected(2) < a.expected(6) < a.expected(2) + 0.2


def test_expected_tokens_without_positions_are_geometric() -> None:
    assert Acceptance((1.0, 1.0)).expected(3) == pytest.approx(1 + 0.5 + 0.25 + 0.125)


def test_pass_cost_is_measured_per_thread_count_and_borrowed_until_measured() -> None:
    """A lane sharing the cores times its passes on one thread or two (#45): each count's
    relative cost is its own (one thread's positions are dearer), so a mix of the two would
    misprice both; a count not timed yet uses the other's figure meanwhile."""
    cost = PassCost()
    cost.threads = 2
    cost.observe(2, 1, 0.150)
    cost.observe(2, 9, 0.300)  # two threads: 8 positions cost one plain pass more
    assert cost.beta(2) == pytest.approx(0.125)
    cost.threads = 1
    assert cost.beta(2) == pytest.approx(0.125)  # borrowed
    assert cost.plain(2) == pytest.approx(0.150)
    assert cost.needs_plain(2)  # its own plain figure is wanted
    cost.observe(2, 9, 0.465)  # nothing of its own to compare with: not mixed in
    assert cost.beta(2) == pytest.approx(0.125)
    cost.observe(2, 1, 0.170)
    cost.observe(2, 9, 0.470)
    assert cost.beta(2) == pytest.approx(0.3 / 0.17 / 8)
    assert cost.report()["draft_position_cost"] == {"2": pytest.approx(0.2206, abs=1e-4)}
    cost.threads = 2
    assert cost.beta(2) == pytest.approx(0.125)  # the two counts' figures stay apart
    assert cost.report()["draft_position_cost"] == {"2": 0.125}
