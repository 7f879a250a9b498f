"""router.worker.drafting.draftcontrol: each step's draft length from acceptance and pass cost."""

from __future__ import annotations

import pytest

from router.worker.drafting.draftcontrol import PRIOR_BETA, Acceptance, PassCost


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
    assert cost.report() == {"draft_position_cost": {"1": 0.2, "4": 0.0}}


def test_pass_cost_fixed_by_the_setting() -> None:
    cost = PassCost(0.05)
    assert not cost.needs_plain(1)
    cost.observe(1, 1, 0.1)
    cost.observe(1, 9, 1.0)
    assert cost.beta(1) == 0.05
    assert cost.report() == {"draft_position_cost": 0.05}
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
