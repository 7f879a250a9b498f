"""router.worker.drafting.draftchoice: which source drafts at each step, from measured cost and
acceptance; what a partition's earlier requests taught."""

from __future__ import annotations

import pytest

from router.worker.drafting.draftchoice import (
    CARRY_WEIGHT,
    DRAFT_MODEL,
    PROBE_EVERY,
    Chooser,
    DraftCandidate,
    DraftCost,
    Evidence,
    batch_width,
    best_rate,
    gap_filler,
)
from router.worker.drafting.draftcontrol import Acceptance, PassCost


class Fixed:
    """A proposer that always proposes ``tokens`` (counting its calls)."""

    def __init__(self, tokens: list[int]) -> None:
        self.tokens = tokens
        self.calls = 0

    def __call__(self, history: list[int], k: int) -> list[int]:
        self.calls += 1
        return self.tokens[:k]


def model_chooser(alpha: tuple[float, float], gamma: float, beta: float = 0.1) -> Chooser:
    draft = DraftCandidate(DRAFT_MODEL, Fixed([7, 7, 7]), 3, Acceptance(alpha))
    return Chooser([draft], PassCost(beta), DraftCost(gamma))


@pytest.mark.parametrize(
    ("gamma", "drafts"),
    [
        (0.05, True),  # a small draft for a large target (a Mac): it pays at 90 %
        (0.25, True),
        (1.0, False),  # the draft costs what the target costs: never, whatever it accepts
        (2.0, False),
    ],
)
def test_the_draft_model_is_chosen_where_it_is_cheap_and_dropped_where_it_is_not(
    gamma: float, drafts: bool
) -> None:
    chooser = model_chooser((9.0, 1.0), gamma)
    choice = chooser.choose([1, 2, 3], 8)
    assert (choice.source == DRAFT_MODEL) is drafts
    if not drafts:
        assert chooser.candidates[0].propose.calls == 0  # type: ignore[attr-defined]


def test_a_cheap_draft_model_that_is_refused_stops_drafting() -> None:
    chooser = model_chooser((1.0, 1.0), 0.05)
    draft = chooser.candidates[0]
    for _ in range(4):
        choice = chooser.choose([1, 2, 3], 8)
        if choice.source is None:
            break
        chooser.verified(choice, 0)
    assert chooser.choose([1, 2, 3], 8).source is None
    assert draft.acceptance.alpha < 0.3


def test_a_draft_model_that_could_pay_is_probed_after_a_while() -> None:
    chooser = model_chooser((0.2, 5.0), 0.05)
    sources = [chooser.choose([1, 2, 3], 8).source for _ in range(PROBE_EVERY + 2)]
    assert sources[: PROBE_EVERY - 1] == [None] * (PROBE_EVERY - 1)
    assert DRAFT_MODEL in sources[PROBE_EVERY - 1 :]


def test_copying_wins_over_a_draft_model_that_costs_a_pass() -> None:
    lookup = DraftCandidate("prompt_lookup", Fixed([4, 5, 6, 7, 8, 9]), 8, Acceptance((9.0, 1.0)))
    draft = DraftCandidate(DRAFT_MODEL, Fixed([4, 5, 6]), 3, Acceptance((9.0, 1.0)))
    chooser = Chooser([draft, lookup], PassCost(0.1), DraftCost(0.3))
    choice = chooser.choose([1, 2, 3], 6)  # the copied run fills the step: nothing to chain
    assert (choice.source, choice.tokens) == ("prompt_lookup", [4, 5, 6, 7, 8, 9])
    assert draft.propose.calls == 0  # type: ignore[attr-defined]


def test_the_draft_model_drafts_chat_when_nothing_copies() -> None:
    lookup = DraftCandidate("prompt_lookup", Fixed([]), 8)  # no match in the context
    draft = DraftCandidate(DRAFT_MODEL, Fixed([4, 5, 6]), 3, Acceptance((9.0, 1.0)))
    chooser = Chooser([lookup, draft], PassCost(0.1), DraftCost(0.1))
    assert chooser.choose([1, 2, 3], 8).source == DRAFT_MODEL


def test_an_unmeasured_draft_model_drafts_once_to_be_measured() -> None:
    draft = DraftCandidate(DRAFT_MODEL, Fixed([4, 5, 6]), 3, Acceptance((1.0, 9.0)))
    chooser = Chooser([draft], PassCost(0.1), DraftCost())
    assert chooser.choose([1, 2, 3], 8).source == DRAFT_MODEL


def test_nothing_pays_a_plain_step_and_the_proposals_are_shadowed() -> None:
    lookup = DraftCandidate("prompt_lookup", Fixed([4, 5, 6]), 8, Acceptance((1.0, 9.0)))
    chooser = Chooser([lookup], PassCost(0.2))
    history = [1, 2, 3]
    assert chooser.choose(history, 8).source is None
    assert chooser.plain_steps == 1
    # The target then emits exactly what lookup proposed: the shadow is scored as kept.
    before = lookup.acceptance.alpha
    history += [4, 5, 6]
    chooser.choose(history, 8)
    assert lookup.acceptance.alpha > before


def test_a_shadow_counts_the_run_until_the_first_miss() -> None:
    lookup = DraftCandidate("prompt_lookup", Fixed([4, 5, 6, 7]), 8, Acceptance((0.0, 1.0)))
    chooser = Chooser([lookup], PassCost(5.0))  # nothing ever pays: shadows only
    chooser.choose([1], 8)
    chooser.choose([1, 4, 5], 8)  # two kept so far, undecided
    assert lookup.shadow is not None
    chooser.choose([1, 4, 5, 9], 8)  # the third misses
    assert (lookup.acceptance.kept, lookup.acceptance.rejected) == pytest.approx((2.0, 1.7))


def test_the_source_that_copies_takes_over_from_one_that_stopped() -> None:
    """Two free sources: the one whose shadows are kept overtakes the one being refused."""
    a = DraftCandidate("prompt_lookup", Fixed([9, 9, 9]), 8, Acceptance((3.0, 1.0)))
    b = DraftCandidate("suffix", Fixed([4, 5, 6]), 8, Acceptance((1.0, 1.0)))
    chooser = Chooser([a, b], PassCost(0.05))
    history = [1, 2, 3]
    picked = []
    for _ in range(6):
        choice = chooser.choose(history, 8)
        picked.append(choice.source)
        emitted = [4, 5, 6]  # what the target writes each time: b's proposal
        kept = 0
        while kept < len(choice.tokens) and choice.tokens[kept] == emitted[kept]:
            kept += 1
        chooser.verified(choice, kept)
        history = history + emitted
        b.propose.tokens = [4, 5, 6]  # type: ignore[attr-defined]
    assert picked[0] == "prompt_lookup"
    assert picked[-1] == "suffix"
    assert chooser.tallies["suffix"].accepted > 0


def test_unpaced_the_first_source_with_a_proposal_always_drafts() -> None:
    draft = DraftCandidate(DRAFT_MODEL, Fixed([4, 5]), 3, Acceptance((0.0, 9.0)))
    chooser = Chooser([draft], PassCost(0.5), DraftCost(3.0), paced=False)
    assert chooser.choose([1], 8).tokens == [4, 5]


def test_draft_cost_is_measured_relative_to_a_plain_pass() -> None:
    cost = DraftCost()
    cost.observe(4, 0.4, None)  # no plain pass measured yet: nothing to compare with
    assert cost.gamma is None
    cost.observe(4, 0.4, 0.1)
    assert cost.gamma == pytest.approx(1.0)
    cost.observe(4, 0.04, 0.1)
    assert 0.1 < cost.gamma < 1.0


def test_best_rate_of_a_free_draft_against_one_that_costs_passes() -> None:
    assert best_rate(Acceptance((9.0, 1.0)), 0.1, 3) > 1.0
    # as slow as the target: plain is better
    assert best_rate(Acceptance((9.0, 1.0)), 0.1, 3, 1.0) == 1.0
    assert best_rate(Acceptance((0.0, 1.0)), 0.1, 8) == 1.0


def test_evidence_carries_a_partitions_acceptance_to_its_next_request() -> None:
    evidence = Evidence()
    fresh = evidence.acceptance("client-a", "prompt_lookup")
    assert fresh.alpha == pytest.approx(0.5)
    evidence.record("client-a", {"prompt_lookup": Acceptance((3.0, 0.1))})
    carried = evidence.acceptance("client-a", "prompt_lookup")
    assert carried.alpha > 0.8
    assert carried.kept + carried.rejected <= CARRY_WEIGHT + 1.0  # a new request can overrule
    assert evidence.acceptance("client-b", "prompt_lookup").alpha == pytest.approx(0.5)


def test_evidence_is_bounded_in_partitions() -> None:
    evidence = Evidence(partitions=2)
    for p in ("a", "b", "c"):
        evidence.record(p, {"suffix": Acceptance((3.0, 0.0))})
    assert evidence.acceptance("a", "suffix").alpha == pytest.approx(0.5)  # dropped
    assert evidence.acceptance("c", "suffix").alpha > 0.8


def test_a_prediction_starts_trusted() -> None:
    cost = PassCost(0.5)  # dear positions: an untried source does not draft at first
    evidence = Evidence()
    trusted = DraftCandidate(
        "prediction", Fixed([1] * 16), 16, evidence.acceptance("p", "prediction")
    )
    untried = DraftCandidate("prompt_lookup", Fixed([1] * 16), 16, evidence.acceptance("p", "x"))
    assert Chooser([trusted], cost).choose([0], 16).source == "prediction"
    assert Chooser([untried], cost).choose([0], 16).source is None


def test_a_step_drafts_the_length_that_yields_most() -> None:
    lookup = DraftCandidate("prompt_lookup", Fixed(list(range(8))), 8, Acceptance((2.0, 3.0)))
    chooser = Chooser([lookup], PassCost(0.18))  # alpha 0.4: a short draft pays, 8 not
    choice = chooser.choose([9], 8)
    assert 0 < len(choice.tokens) < 8
    lookup.acceptance = Acceptance((19.0, 1.0))  # copying: the whole proposal
    assert len(chooser.choose([9], 8).tokens) == 8


def test_runs_kept_whole_draft_far_at_an_acceptance_that_would_draft_short() -> None:
    """Copying is all or nothing: a draft refused at its first token or kept to its end.
    Per position that is a high first hurdle and certainty after it, which drafts the whole
    proposal, where one figure per token (alpha 0.8) would stop after a few."""
    runs = Acceptance()
    for _ in range(8):
        runs.verified(8, 0)
        runs.verified(8, 0)
        runs.verified(8, 8)
    assert (
        len(
            Chooser([DraftCandidate("p", Fixed(list(range(8))), 8, runs)], PassCost(0.15))
            .choose([9], 8)
            .tokens
        )
        == 8
    )
    geometric = Acceptance((runs.kept, runs.rejected))  # the same alpha, no positions
    short = Chooser([DraftCandidate("p", Fixed(list(range(8))), 8, geometric)], PassCost(0.15))
    assert len(short.choose([9], 8).tokens) < 8


class Graded:
    """A copying proposer whose proposals carry a match length (``matched``)."""

    def __init__(self) -> None:
        self.matched = 0
        self.tokens = [5, 6, 7, 8]

    def __call__(self, history: list[int], k: int) -> list[int]:
        return self.tokens[:k]


def test_acceptance_is_kept_per_match_length_class() -> None:
    """Short matches refused, long ones kept: a short match's proposal stops drafting, a
    long match's still drafts (SuffixDecoding's insight), where one figure would average
    the two."""
    proposer = Graded()
    lookup = DraftCandidate("prompt_lookup", proposer, 4, grade=lambda: proposer.matched)
    chooser = Chooser([lookup], PassCost(0.2))
    for _ in range(6):
        for matched, kept in ((2, 0), (12, 4)):
            proposer.matched = matched
            choice = chooser.choose([1], 4)
            if choice.source is not None:
                chooser.verified(choice, kept)
            else:  # a shadow, settled by the next step's history
                chooser.choose([1, *([9] if kept == 0 else proposer.tokens)], 0)
    proposer.matched = 2
    assert chooser.choose([1], 4).source is None
    proposer.matched = 12
    assert chooser.choose([1], 4).tokens == [5, 6, 7, 8]
    assert set(lookup.graded) == {2, 4}  # classes 2-3 and 8-15


def test_a_short_copied_run_is_continued_by_a_draft_model_that_pays() -> None:
    lookup = DraftCandidate("prompt_lookup", Fixed([4, 5]), 8, Acceptance((9.0, 1.0)))
    model = Fixed([6, 7, 8])
    draft = DraftCandidate(DRAFT_MODEL, model, 3, Acceptance((3.0, 1.0)))
    chooser = Chooser([lookup, draft], PassCost(0.05), DraftCost(0.05))
    choice = chooser.choose([1, 2, 3], 8)
    assert (choice.source, choice.tokens, choice.chained) == ("prompt_lookup", [4, 5, 6, 7, 8], 2)
    chooser.verified(choice, 3)  # the copied run kept, the model's first token too
    assert (chooser.tallies["prompt_lookup"].accepted, chooser.tallies["draft_model"].accepted) == (
        2,
        1,
    )
    before = draft.acceptance.alpha
    chooser.verified(choice, 1)  # refused inside the copied run: the model was not tried
    assert draft.acceptance.alpha == before


def test_no_chain_where_the_draft_model_does_not_pay() -> None:
    lookup = DraftCandidate("prompt_lookup", Fixed([4, 5]), 8, Acceptance((9.0, 1.0)))
    draft = DraftCandidate(DRAFT_MODEL, Fixed([6, 7, 8]), 3, Acceptance((9.0, 1.0)))
    chooser = Chooser([lookup, draft], PassCost(0.05), DraftCost(1.0))
    choice = chooser.choose([1, 2, 3], 8)
    assert (choice.tokens, choice.chained) == ([4, 5], None)
    assert draft.propose.calls == 0  # type: ignore[attr-defined]


def test_free_positions_draft_the_longest_whatever_the_acceptance() -> None:
    """``draft_position_cost = 0``: a draft costs nothing, so even a refused source drafts."""
    lookup = DraftCandidate("prompt_lookup", Fixed(list(range(8))), 8, Acceptance((0.0, 9.0)))
    assert len(Chooser([lookup], PassCost(0.0)).choose([9], 8).tokens) == 8


def test_a_row_drafts_up_to_the_width_of_the_batched_pass_for_free() -> None:
    """A batched pass is as wide as its longest row: a row whose own rule drafts short (or
    nothing) drafts what its source proposed up to that width, and is judged on it."""
    lookup = DraftCandidate("prompt_lookup", Fixed([4, 5, 6, 7, 8, 9]), 8, Acceptance((1.0, 4.0)))
    chooser = Chooser([lookup], PassCost(0.5))
    choice = chooser.choose([1, 2, 3], 8)
    assert choice.source is None  # on its own: refused too often to pay
    assert chooser.plain_steps == 1
    curve = chooser.curve(choice, 8)
    assert curve is not None and len(curve) == 7  # priced as far as it proposed
    widened = chooser.resize(choice, 4)
    assert (widened.source, widened.tokens) == ("prompt_lookup", [4, 5, 6, 7])
    assert lookup.shadow is None  # drafted now: verified, not shadowed as well
    assert chooser.plain_steps == 0  # it drafted after all
    before = lookup.acceptance.kept
    chooser.verified(widened, 4)
    assert lookup.acceptance.kept > before
    assert chooser.tallies["prompt_lookup"].drafted == 4


def test_resizing_keeps_a_draft_that_is_already_as_wide() -> None:
    lookup = DraftCandidate("prompt_lookup", Fixed([4, 5]), 8, Acceptance((9.0, 1.0)))
    chooser = Chooser([lookup], PassCost(0.05))
    choice = chooser.choose([1, 2, 3], 8)
    assert choice.tokens == [4, 5]
    assert chooser.resize(choice, 2) is choice
    none = chooser.choose([1, 2, 3], 0)  # no room: no step to size
    assert chooser.curve(none, 6) is None and chooser.resize(none, 6) is none


def test_a_draft_the_batch_does_not_pay_for_stays_a_shadow_and_keeps_learning() -> None:
    """Cut to nothing by the batch's width, the proposal is scored against what the target
    emits, as any proposal that did not draft."""
    lookup = DraftCandidate("prompt_lookup", Fixed([4, 5, 6]), 8, Acceptance((6.0, 4.0)))
    chooser = Chooser([lookup], PassCost(0.3))
    choice = chooser.choose([1, 2, 3], 8)
    assert choice.tokens  # alone it pays
    plain = chooser.resize(choice, 0)
    assert plain.source is None and plain.tokens == []
    assert chooser.plain_steps == 1
    assert lookup.shadow is not None and lookup.shadow.tokens == [4, 5, 6]
    before = lookup.acceptance.kept
    chooser.choose([1, 2, 3, 4, 5, 6], 8)  # the target emitted what it proposed
    assert lookup.acceptance.kept > before
    shorter = chooser.resize(chooser.choose([1, 2, 3, 4, 5, 6], 8), 1)
    assert shorter.tokens == [4]


def test_a_source_the_client_named_is_not_the_batchs_to_size() -> None:
    lookup = DraftCandidate("prompt_lookup", Fixed([4, 5]), 8)
    chooser = Chooser([lookup], PassCost(0.3), paced=False)
    choice = chooser.choose([1, 2, 3], 8)
    assert chooser.curve(choice, 8) is None


# A row that copies a long run, one with a middling acceptance, one with nothing proposed.
COPYING = Acceptance((9.5, 0.5)).expected_upto(8)
MIDDLING = [1.0, 1.5, 1.75]
NOTHING = [1.0]


def test_a_middling_draft_that_pays_alone_does_not_pay_for_a_pass_its_neighbour_waits_on() -> None:
    """Widening the pass slows every row: 1.5 tokens for a pass 1.3 times as long pays for
    one sequence, not for two that both wait on it (2.5 tokens against 2)."""
    assert batch_width([MIDDLING], 0.3) == 1
    assert batch_width([MIDDLING, NOTHING], 0.3) == 0
    assert batch_width([MIDDLING], 0.3, settled=1.0) == 0  # a plain row the width does not size
    assert batch_width([MIDDLING, MIDDLING], 0.3) == 1  # two rows that both gain do pay


def test_a_long_copy_widens_the_pass_for_the_rows_beside_it() -> None:
    assert batch_width([COPYING, NOTHING, MIDDLING], 0.1) == 8
    assert batch_width([COPYING] * 3, 0.1) == 8


def test_the_batch_width_keeps_the_floor_and_drafts_the_longest_when_positions_are_free() -> None:
    assert batch_width([MIDDLING, NOTHING], 0.3, settled=4.0, floor=3) == 3
    assert batch_width([NOTHING], 0.3, floor=2) == 2
    assert batch_width([MIDDLING, NOTHING], 0.0) == 2
    assert batch_width([], 0.3) == 0


def test_a_constrained_answers_gaps_are_filled_by_the_cheapest_source_that_copies() -> None:
    def c(name: str) -> DraftCandidate:
        return DraftCandidate(name, Fixed([1]), 4)

    lookup, suffix, model, prediction = (
        c("prompt_lookup"),
        c("suffix"),
        c(DRAFT_MODEL),
        c("prediction"),
    )
    # The client's earlier answers first, whatever the order the lane lists its sources in.
    assert gap_filler([lookup, suffix]) is suffix
    assert gap_filler([prediction, lookup, suffix, model]) is suffix
    assert gap_filler([model, lookup]) is lookup  # a free source before a draft model
    assert gap_filler([model]) is model
    assert gap_filler([]) is None
