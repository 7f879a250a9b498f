"""The batching engine's chunk sizing and draft plans (no model: the decisions only)."""

from __future__ import annotations

import threading
from types import SimpleNamespace
from typing import Any

import pytest

from router.worker.drafting.draftchoice import DraftCandidate
from router.worker.drafting.draftcontrol import Acceptance
from router.worker.drafting.draftlength import BatchDraftSettings
from router.worker.drafting.forced import ConstraintDraft
from router.worker.engines.batching import (
    FIRST_CHUNK,
    IDLE_FACTOR,
    MIN_CHUNK,
    BatchingEngine,
    _Sequence,
)
from router.worker.engines.engine import Models
from router.worker.request.protocol import GenerationRequest


def engine(step: int = 2048, seconds: float = 0.5) -> BatchingEngine:
    return BatchingEngine(
        lambda: Models(None, None), 4, prefill_step_size=step, chunk_seconds=seconds
    )


def live(prefilling: int, decoding: int) -> dict[int, _Sequence]:
    seqs: list[Any] = [_Sequence(None, None, None) for _ in range(prefilling + decoding)]  # type: ignore[arg-type]
    for seq in seqs[prefilling:]:
        seq.decoding = True
    return dict(enumerate(seqs))


def test_the_first_chunk_is_small_until_the_rate_is_measured() -> None:
    assert engine()._chunk(live(1, 1)) == FIRST_CHUNK
    assert engine(step=32)._chunk(live(1, 0)) == 32


@pytest.mark.parametrize(
    ("rate", "prefilling", "step", "chunk"),
    [
        (100.0, 1, 2048, 50),  # a slow machine: half a second is 50 tokens
        (100.0, 2, 2048, 25),  # two prompts share the half second
        (10.0, 1, 2048, MIN_CHUNK),
        (20_000.0, 1, 2048, 2048),  # a fast machine: bounded by prefill_step_size
        (20_000.0, 1, 512, 512),
    ],
)
def test_chunks_take_about_chunk_seconds(
    rate: float, prefilling: int, step: int, chunk: int
) -> None:
    e = engine(step=step)
    e.prefill_rate = rate
    assert e._chunk(live(prefilling, 1)) == chunk


def test_chunks_are_bigger_while_nothing_decodes() -> None:
    e = engine()
    e.prefill_rate = 100.0
    assert e._chunk(live(1, 0)) == 50 * IDLE_FACTOR
    assert e._chunk(live(1, 1)) == 50
    # The shared worker: a speculative request waits for this step, so no idle chunk.
    assert e._chunk(live(1, 0), others_waiting=True) == 50


def test_the_rate_is_a_moving_average_of_calls_that_prefilled_enough() -> None:
    e = engine()
    e._measure(MIN_CHUNK - 1, 0.1)  # too little to measure
    assert e.prefill_rate is None
    e._measure(100, 1.0)
    assert e.prefill_rate == 100.0
    e._measure(300, 1.0)
    assert e.prefill_rate == 200.0
    e._measure(100, 0.0)
    assert e.prefill_rate == 200.0


def test_bad_settings_are_refused() -> None:
    with pytest.raises(ValueError):
        engine(step=0)
    with pytest.raises(ValueError):
        engine(seconds=0)


@pytest.mark.parametrize(
    ("source", "filler"),
    [("auto", "suffix"), ("prompt_lookup", "prompt_lookup"), ("suffix", "suffix")],
)
def test_a_constrained_row_fills_its_grammars_gaps_as_the_speculative_lane_does(
    monkeypatch: pytest.MonkeyPatch, source: str, filler: str
) -> None:
    """Under ``auto`` the gaps between forced runs are filled by the client's earlier
    answers (``suffix``), not by the first source listed (prompt lookup): a tool call's
    structure repeats across turns, not in its prompt (the constrained regression of
    #45)."""
    grammar = SimpleNamespace()
    monkeypatch.setattr(ConstraintDraft, "for_constraint", classmethod(lambda *a: grammar))
    lane = BatchingEngine(lambda: Models(None, None), 4, drafts=BatchDraftSettings())
    request = GenerationRequest("chat", draft_source=source, constraint=object())
    job: Any = SimpleNamespace(
        request=request, prompt_ids=[1, 2, 3], partition="p", constraint_failed=None
    )
    seq = _Sequence(job, None, None)  # type: ignore[arg-type]
    proposers: dict[str, Any] = {}
    made = lane._candidate

    def candidate(seq: _Sequence, name: str) -> Any:
        c = made(seq, name)
        proposers[name] = c.propose
        return c

    monkeypatch.setattr(lane, "_candidate", candidate)
    lane._plan(seq)
    assert seq.constraint is grammar and seq.chooser is None
    assert seq.propose is proposers[filler]


def _drafting_row(
    lane: BatchingEngine, monkeypatch: pytest.MonkeyPatch, tokens: list[int], kept: float
) -> _Sequence:
    """A decoding sequence of ``lane`` whose one source proposes ``tokens`` and keeps about
    ``kept`` of each draft token (its carried acceptance)."""

    def candidate(seq: _Sequence, name: str) -> DraftCandidate:
        return DraftCandidate(name, lambda history, k: tokens[:k], 8, Acceptance((kept, 1 - kept)))

    monkeypatch.setattr(lane, "_candidate", candidate)
    request = GenerationRequest("chat", draft_source="prompt_lookup")
    job: Any = SimpleNamespace(
        request=request, prompt_ids=[1, 2, 3], partition="p", cancelled=threading.Event()
    )
    seq = _Sequence(job, None, None)  # type: ignore[arg-type]
    lane._plan(seq)
    assert seq.chooser is not None
    return seq


def _plain_row() -> _Sequence:
    job: Any = SimpleNamespace(request=GenerationRequest("chat"), cancelled=threading.Event())
    return _Sequence(job, None, None)  # type: ignore[arg-type]


def test_the_batchs_pass_is_as_wide_as_pays_every_row_not_one(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A middling draft that pays for its own sequence widens a pass the plain row beside it
    waits on: the batch drafts none of it; beside a copy it drafts up to the copy's width,
    for free (#45: draft lengths priced at the batch's real width)."""
    lane = BatchingEngine(
        lambda: Models(None, None),
        4,
        drafts=BatchDraftSettings(draft_source="prompt_lookup", draft_position_cost=0.3),
    )
    middling = _drafting_row(lane, monkeypatch, [7, 8, 9], 0.5)
    lane._live = {0: middling}
    history = [[1, 2, 3]]
    assert lane._propose([0], history, [50]) == [[7]]  # alone: one token pays
    lane._live = {0: middling, 1: _plain_row()}
    assert lane._propose([0, 1], history * 2, [50, 50]) == [[], []]
    assert middling.choice.source is None
    copying = _drafting_row(lane, monkeypatch, [4, 5, 6, 7, 8, 9], 0.95)
    lane._live = {0: middling, 1: copying}
    # The copy's width pays the batch at three positions (not six, at this cost); the
    # middling row drafts all three of its own at no cost.
    assert lane._propose([0, 1], history * 2, [50, 50]) == [[7, 8, 9], [4, 5, 6]]
