"""The pure draft proposers, table-tested (token ids are small ints; letters read as tokens)."""

from __future__ import annotations

import pytest

from router.worker.drafting.drafts import (
    LookupConfig,
    PredictionConfig,
    PredictionDraft,
    PromptLookup,
)


def ids(text: str) -> list[int]:
    return [ord(c) for c in text]


def text(tokens: list[int]) -> str:
    return "".join(chr(t) for t in tokens)


@pytest.mark.parametrize(
    ("sequence", "k", "config", "expected"),
    [
        ("abcdXYZabc", 3, LookupConfig(2, 3, 8), "dXY"),  # the 3-gram "abc" was seen
        ("abcdXYZabc", 8, LookupConfig(2, 3, 2), "dX"),  # capped by max_draft
        ("abcdXYZabc", 0, LookupConfig(2, 3, 8), ""),
        ("abcdefgh", 4, LookupConfig(2, 3, 8), ""),  # nothing repeats
        ("xyAB1xyAB2zAB", 2, LookupConfig(2, 4, 8), "2z"),  # the latest occurrence wins
        ("qAB1xyAB2xyAB", 2, LookupConfig(2, 4, 8), "2x"),  # a longer n-gram first ("yAB")
        ("ab", 4, LookupConfig(2, 3, 8), ""),  # the suffix itself is never a match
        ("aaaa", 3, LookupConfig(1, 2, 8), "a"),  # the draft may run into the suffix
        ("xyz.abc", 2, LookupConfig(1, 1, 8), ""),
        ("c.abc", 2, LookupConfig(1, 1, 8), ".a"),  # unigram lookups when allowed
    ],
)
def test_prompt_lookup_proposes_what_followed_the_suffix(
    sequence: str, k: int, config: LookupConfig, expected: str
) -> None:
    assert text(PromptLookup(config).propose(ids(sequence), k)) == expected


@pytest.mark.parametrize(
    ("sequence", "matched"),
    [
        ("abcdXYZabc", 3),  # "abc" matched, nothing before it agrees
        ("zabcdXYZzabc", 4),  # the match reaches back past the 3-gram
        ("qwertyuiop-qwertyuiop", 10),
        ("abcdefgh", 0),  # no proposal
    ],
)
def test_prompt_lookup_reports_how_far_its_match_reaches(sequence: str, matched: int) -> None:
    lookup = PromptLookup(LookupConfig(2, 3, 8))
    lookup.propose(ids(sequence), 4)
    assert lookup.matched == matched


def test_prompt_lookup_indexes_incrementally_and_restarts_on_a_new_sequence() -> None:
    lookup = PromptLookup(LookupConfig(2, 2, 4))
    grown = "the cat sat. the "
    for end in range(1, len(grown) + 1):  # as the engine calls it: one longer each time
        last = lookup.propose(ids(grown[:end]), 4)
    assert text(last) == "cat "
    assert text(lookup.propose(ids("zzq zz"), 4)) == "q zz"  # not a continuation: re-indexed


@pytest.mark.parametrize("bad", [(0, 2, 4), (3, 2, 4), (2, 3, 0)])
def test_lookup_config_is_checked(bad: tuple[int, int, int]) -> None:
    with pytest.raises(ValueError):
        LookupConfig(*bad)


PREDICTED = "line one\nline two\nline three\nline four\n"


def follow(prediction: str, output: str, k: int = 4, config: PredictionConfig | None = None):
    """Write ``output`` one token at a time; the drafts the proposer offered before each."""
    draft = PredictionDraft(ids(prediction), config or PredictionConfig(2, 4, 16))
    offered = [text(draft.propose(ids(output[:i]), k)) for i in range(len(output) + 1)]
    return draft, offered


def test_a_prediction_in_step_is_proposed_from_where_the_output_is() -> None:
    draft, offered = follow(PREDICTED, PREDICTED[:14])
    assert offered[0] == "line"
    assert offered[9] == "line"  # after "line one\n"
    assert offered[13] == " two"  # after "line one\nline"
    assert draft.matched == 14 and draft.unmatched == len(PREDICTED) - 14


def test_max_draft_caps_what_is_offered() -> None:
    _, offered = follow(PREDICTED, "", k=10, config=PredictionConfig(2, 4, 3))
    assert offered == ["lin"]


def verify(prediction: str, output: str, k: int = 8) -> tuple[PredictionDraft, int, int]:
    """What the engine's verify step does with a target that writes ``output``: per step, the
    longest agreeing run of the draft plus the target's own token. (accepted, steps)"""
    draft = PredictionDraft(ids(prediction), PredictionConfig(2, 4, 16))
    target, done, accepted, steps = ids(output), 0, 0, 0
    while done < len(target):
        offered = draft.propose(target[:done], k)
        n = 0
        while n < len(offered) and done + n < len(target) and offered[n] == target[done + n]:
            n += 1
        accepted += n
        done += n + 1
        steps += 1
    return draft, accepted, steps


CHANGED = PREDICTED.replace("line two", "LINE 2!")
INSERTED = PREDICTED.replace("line two\n", "line two\nextra line\n")
DELETED = PREDICTED.replace("line two\n", "")


@pytest.mark.parametrize(
    ("output", "new", "gone"),
    [
        (PREDICTED, 0, 0),
        (CHANGED, len("LINE 2!"), len("line two")),
        (INSERTED, len("extra line\n"), 0),
        (DELETED, 0, len("line two\n")),
    ],
)
def test_a_diverging_output_is_realigned_and_most_of_the_prediction_accepted(
    output: str, new: int, gone: int
) -> None:
    draft, accepted, steps = verify(PREDICTED, output)
    # All but the new text and a few tokens spent finding the way back is accepted...
    assert accepted >= len(output) - new - 8, (accepted, len(output))
    assert steps <= len(output) // 2
    # ...and all of the prediction the output kept is counted, each token once.
    assert len(PREDICTED) - gone - 12 <= draft.matched <= len(PREDICTED) - gone
    assert draft.matched + draft.unmatched == len(PREDICTED)


def test_realignment_prefers_the_occurrence_after_where_the_output_left() -> None:
    prediction = "x = 1\ny = 2\nx = 1\nz = 3\n"
    draft = PredictionDraft(ids(prediction), PredictionConfig(2, 3, 16))
    output = "x = 1\ny = 2\nQ\nx = "  # "Q" replaces nothing: inserted; then back in step
    for i in range(len(output) + 1):
        offered = text(draft.propose(ids(output[:i]), 6))
    assert offered == "1\nz = "  # the second "x = ", not the first


def test_an_unrelated_output_gets_no_draft_and_no_credit() -> None:
    draft, offered = follow(PREDICTED, "zzzz yyyy")
    assert offered[0] == "line" and all(o == "" for o in offered[2:])
    assert draft.matched == 0


def test_an_empty_prediction_proposes_nothing() -> None:
    draft = PredictionDraft([], PredictionConfig())
    assert draft.propose([], 4) == [] and draft.propose(ids("abc"), 4) == []
