"""Log-probabilities: the top-k pick over real MLX arrays, and the entries kept in line with
the text sent (``Aligner``, pure)."""

from __future__ import annotations

import math

import pytest

from router.worker.engines.logprobs import FLOOR, Aligner, TokenLogprob, pick


def aligner() -> Aligner:
    return Aligner(lambda token: f"<{token}>")


def test_pick_normalizes_logits_and_ranks_the_alternatives() -> None:
    import mlx.core as mx

    rows = mx.array([[2.0, 0.0, 1.0, -mx.inf], [0.0, 0.0, 0.0, 0.0]])
    (first, second) = pick(rows, [2, 3], 2)
    total = math.log(math.exp(2) + 1 + math.exp(1))
    assert first[0] == pytest.approx(1 - total, abs=1e-5)
    assert [i for i, _ in first[1]] == [0, 2]  # most likely first
    assert first[1][0][1] == pytest.approx(2 - total, abs=1e-5)
    assert second[0] == pytest.approx(-math.log(4), abs=1e-5)
    assert pick(rows, [3, 0], 0)[0] == (FLOOR, [])  # ruled out: OpenAI's floor, not -inf


def test_entries_go_out_with_the_text_that_completes_them() -> None:
    a = aligner()
    a.token("He", (-0.1, [(7, -0.1)]))
    a.token("llo", (-0.2, []))
    assert a.sent(3) == (TokenLogprob("He", -0.1, (("<7>", -0.1),)),)  # "llo" not all out
    assert a.sent(2) == (TokenLogprob("llo", -0.2),)
    assert a.end(stopped=False) == ()


def test_a_stop_string_drops_its_tokens_and_cuts_the_one_it_splits() -> None:
    a = aligner()
    for text, lp in (("Paris", -0.1), (". Done", -0.2), (" now", -0.3)):
        a.token(text, (lp, []))
    assert a.sent(len("Paris.")) == (TokenLogprob("Paris", -0.1),)  # stop: " Done"
    assert a.end(stopped=True) == (TokenLogprob(".", -0.2),)


def test_a_token_with_no_text_yet_waits_for_the_flush() -> None:
    """A character split over tokens: the first has no text of its own; the detokenizer's
    flush at the end belongs to the last token."""
    a = aligner()
    a.token("a", (-0.1, []))
    a.token("", (-0.2, []))
    assert a.sent(1) == (TokenLogprob("a", -0.1),)
    a.more("é")
    assert a.sent(1) == (TokenLogprob("é", -0.2),)
    assert a.end(stopped=False) == ()
