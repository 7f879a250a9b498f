"""router.worker.draftcontrol: each step's draft length from acceptance and pass cost."""

from __future__ import annotations

import pytest

from router.worker.draftcontrol import (
    PREDICTION_PRIOR,
    PRIOR_BETA,
    Acceptance,
    Pace,
    PassCost,
    best_length,
    expected_tokens,
)


def test_expected_tokens_counts_the_targets_own_token() -> None:
    assert expected_tokens(0.0, 8) == 1.0
    assert expected_tokens(1.0, 4) == 5.0
    assert expected_tokens(0.5, 2) == pytest.approx(1.75)


@pytest.mark.parametrize(
    ("alpha", "beta", "most", "want"),
    [
        (0.15, 0.18, 8, 0),  # rejected drafts on a CPU: a plain step is cheaper
        (0.15, 0.0, 8, 8),  # free positions: the longest draft
        (0.6, 0.18, 8, 2),
        (0.95, 0.18, 8, 8),
        (0.95, 0.18, 3, 3),  # never past the maximum
        (0.9, 0.05, 0, 0),
    ],
)
def test_best_length(alpha: float, beta: float, most: int, want: int) -> None:
    assert best_length(alpha, beta, most) == want


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


def test_shadow_proposal_is_scored_against_the_next_token() -> None:
    a = Acceptance()
    start = a.alpha
    a.propose_unverified(3, [7, 8])
    a.check([1, 2, 3])  # the token it guessed has not come yet
    assert a.alpha == start
    a.check([1, 2, 3, 7])
    hit = a.alpha
    assert hit > start
    a.check([1, 2, 3, 7, 9])  # scored once
    assert a.alpha == hit
    a.propose_unverified(5, [4])
    a.check([1, 2, 3, 7, 9, 5])
    assert a.alpha < hit
    a.propose_unverified(6, [])  # no proposal: nothing to score
    a.check([1, 2, 3, 7, 9, 5, 0])
    assert a.alpha < hit


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


def test_pace_stops_drafting_what_is_rejected_and_resumes_on_a_copy() -> None:
    """On a machine where positions cost (a CPU), a sequence whose drafts fail stops
    drafting; its shadow proposals then start matching (it copies) and it drafts again."""
    cost = PassCost()
    cost.observe(1, 1, 0.1)
    cost.observe(1, 9, 0.244)
    pace = Pace(cost)
    history = list(range(100))
    assert pace.length(history, 8) > 0
    for _ in range(3):
        pace.passed(9, 0.244, 8, 0)
    assert pace.length(history, 8) == 0
    for _ in range(6):
        token = len(history)
        pace.acceptance.propose_unverified(len(history), [token])
        history.append(token)
        pace.length(history, 8)  # scores the shadow proposal
    assert pace.length(history, 8) == 8


def test_a_prediction_starts_trusted() -> None:
    cost = PassCost(0.5)  # dear positions: an untried source does not draft at first
    assert Pace(cost, "prediction").acceptance.alpha == PREDICTION_PRIOR[0] / sum(PREDICTION_PRIOR)
    trusted, untried = Pace(cost, "prediction"), Pace(cost, "prompt_lookup")
    assert (trusted.length([], 16), untried.length([], 16)) == (16, 0)


def test_a_step_drafts_the_most_when_any_draft_pays() -> None:
    cost = PassCost(0.18)
    pace = Pace(cost)
    pace.acceptance.verified(8, 3)  # alpha about 0.6: a short draft pays, the longest not
    assert best_length(pace.acceptance.alpha, 0.18, 8) < 8
    assert pace.length([], 8) == 8
