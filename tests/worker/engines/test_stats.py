from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from router.worker.engines.stats import SpecCounter, SpecStats, merge_usage, usage


def speculative_rounds(
    accepts: list[int], k: int, max_tokens: int
) -> tuple[list[bool], list[tuple[int, int]]]:
    """Replay mlx-lm's speculative_generate_step loop with a scripted number of accepted drafts
    per round: the from_draft flags it yields, and (tokens before the round, drafted) per round."""
    flags: list[bool] = []
    rounds: list[tuple[int, int]] = []
    ntoks = 0
    for wanted in accepts:
        num_draft = min(max_tokens - ntoks, k)
        rounds.append((ntoks, num_draft))
        n = 0
        while n < min(wanted, num_draft):
            n += 1
            ntoks += 1
            flags.append(True)
            if ntoks == max_tokens:
                break
        if ntoks < max_tokens:
            ntoks += 1
            flags.append(False)
        if ntoks == max_tokens:
            break
    return flags, rounds


def count(flags: list[bool], k: int, max_tokens: int) -> SpecCounter:
    counter = SpecCounter(k, max_tokens)
    for flag in flags:
        counter.observe(flag)
    return counter


def test_every_draft_accepted_then_the_target_token() -> None:
    counter = count([True, True, True, False], k=3, max_tokens=4)
    assert counter.snapshot() == SpecStats(drafted=3, accepted=3, steps=1, num_draft_tokens=3)


def test_the_last_round_drafts_only_what_max_tokens_leaves() -> None:
    # round 1 drafts 3 (+1 target token), round 2 may draft only 1 of K=3
    counter = count([True, True, True, False, True], k=3, max_tokens=5)
    stats = counter.snapshot()
    assert (stats.drafted, stats.accepted, stats.steps) == (4, 4, 2)


def test_rejections_are_drafted_minus_accepted() -> None:
    counter = count([False, True, False, True, True, False], k=3, max_tokens=100)
    stats = counter.snapshot()
    assert (stats.drafted, stats.accepted, stats.steps, stats.rejected) == (9, 3, 3, 6)


def test_stopping_mid_round_counts_the_unused_drafts_as_rejected() -> None:
    # the consumer stops (EOS, stop string) after the first token of a fully drafted round
    counter = count([True], k=4, max_tokens=50)
    stats = counter.snapshot()
    assert (stats.drafted, stats.accepted, stats.rejected, counter.tokens) == (4, 1, 3, 1)


def test_plain_decoding_reports_zeros() -> None:
    counter = count([False] * 7, k=0, max_tokens=7)
    assert counter.snapshot() == SpecStats()
    assert counter.tokens == 7


def test_a_draft_token_without_speculation_is_an_error() -> None:
    with pytest.raises(ValueError):
        count([True], k=0, max_tokens=5)


@given(
    k=st.integers(1, 8),
    max_tokens=st.integers(1, 60),
    accepts=st.lists(st.integers(0, 8), min_size=60, max_size=60),
    consumed_fraction=st.floats(0, 1),
)
def test_counter_matches_the_rounds_mlx_lm_runs(
    k: int, max_tokens: int, accepts: list[int], consumed_fraction: float
) -> None:
    flags, rounds = speculative_rounds(accepts, k, max_tokens)
    consumed = max(1, round(len(flags) * consumed_fraction))
    counter = count(flags[:consumed], k, max_tokens)
    started = [drafted for before, drafted in rounds if before < consumed]
    stats = counter.snapshot()
    assert stats.steps == len(started)
    assert stats.drafted == sum(started)
    assert stats.accepted == sum(flags[:consumed])
    assert 0 <= stats.accepted <= stats.drafted
    assert counter.tokens == consumed <= max_tokens


def test_usage_with_drafts_counts_them_in_speclane_spec_not_openais_prediction_fields() -> None:
    body = usage(10, 5, SpecStats(drafted=6, accepted=4, steps=2, num_draft_tokens=3))
    assert body["total_tokens"] == 15
    # OpenAI's accepted/rejected_prediction_tokens are a request's ``prediction``'s only.
    assert "completion_tokens_details" not in body
    assert body["speclane_spec"] == {
        "drafted": 6,
        "accepted": 4,
        "rejected": 2,
        "steps": 2,
        "num_draft_tokens": 3,
    }


def test_usage_without_speculation_is_all_zeros_and_no_details() -> None:
    body = usage(3, 2, SpecStats())
    assert "completion_tokens_details" not in body
    assert body["speclane_spec"] == {
        "drafted": 0,
        "accepted": 0,
        "rejected": 0,
        "steps": 0,
        "num_draft_tokens": 0,
    }


def test_usage_reports_cached_prompt_tokens_in_openai_details() -> None:
    assert usage(3, 2, SpecStats())["prompt_tokens_details"] == {"cached_tokens": 0}
    body = usage(100, 2, SpecStats(), cached_tokens=96)
    assert body["prompt_tokens_details"] == {"cached_tokens": 96}
    assert body["prompt_tokens"] == 100  # cached tokens are part of the prompt, as in OpenAI


def test_n_choices_usage_counts_the_prompt_once_and_sums_the_rest() -> None:
    one = usage(10, 5, SpecStats(drafted=6, accepted=4, steps=2, num_draft_tokens=3))
    two = usage(10, 3, SpecStats(drafted=2, accepted=1, steps=1, num_draft_tokens=3), 9)
    for body, source in (
        (one, {"drafted": 6, "accepted": 4}),
        (two, {"drafted": 2, "accepted": 1}),
    ):
        spec = body["speclane_spec"]
        assert isinstance(spec, dict)
        spec["source"], spec["sources"] = "auto", {"suffix": source}
    merged = merge_usage([one, two])
    assert (merged["prompt_tokens"], merged["completion_tokens"], merged["total_tokens"]) == (
        10,
        8,
        18,
    )
    assert merged["prompt_tokens_details"] == {"cached_tokens": 0}  # the first's: it prefilled
    assert merged["speclane_spec"] == {
        "drafted": 8,
        "accepted": 5,
        "rejected": 3,
        "steps": 3,
        "num_draft_tokens": 3,
        "source": "auto",
        "sources": {"suffix": {"drafted": 8, "accepted": 5}},
    }
    assert merge_usage([one]) is one
