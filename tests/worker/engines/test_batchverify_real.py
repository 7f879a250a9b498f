"""Drafting on the batching lane, on the real default model (in-process): every source is
lossless against plain batched decoding (``num_draft_tokens: 0``), sequences of one batch
that accept different lengths each stay exact (per-sequence trimming), a sequence cancelled
mid-verify leaves the others going, and the ``suffix`` index keeps to its partition."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from typing import Any

import pytest

from router.worker.drafting.draftchoice import Evidence
from router.worker.drafting.draftcontrol import PassCost
from router.worker.drafting.draftlength import BatchDraftSettings
from router.worker.drafting.suffix import SuffixIndex
from router.worker.engines.batching import BatchingEngine
from router.worker.engines.engine import Models
from router.worker.engines.jobs import Failed, Finished, Job, TextDelta
from router.worker.request.protocol import GenerationRequest, Message

pytestmark = pytest.mark.realmodel

MAX_TOKENS = 24
CODE = """def total(values):
    result = 0
    for value in values:
        result = result + value
    return result
"""
EDIT = f"Rename the function total to sum_all in this code and show the whole code:\n{CODE}"
QUESTION = "Write a short Python function that returns the largest of a list of numbers."
WRONG = "The quick brown fox jumps over the lazy dog. " * 4


@pytest.fixture(scope="module")
def engine(loaded_models: tuple[Any, Any, Any]) -> Iterator[BatchingEngine]:
    def load_models() -> Models:
        model, tokenizer, _ = loaded_models  # the session's (evaluated: shareable)
        return Models(model, tokenizer)

    # Free positions: every step drafts the longest (as before per-step lengths), so these
    # tests' counts do not depend on timings; the pacing test sets its own.
    engine = BatchingEngine(load_models, 4, drafts=BatchDraftSettings(draft_position_cost=0.0))
    engine.start()
    yield engine
    engine.stop(30)


def request(content: str, **fields: Any) -> GenerationRequest:
    return GenerationRequest(
        kind="chat",
        messages=(Message("user", content),),
        temperature=0.0,
        **{"max_tokens": MAX_TOKENS, **fields},
    )


def job_for(
    engine: BatchingEngine, req: GenerationRequest, loop: asyncio.AbstractEventLoop, partition: str
) -> Job:
    assert engine.models is not None
    tokenizer = engine.models.tokenizer
    text = tokenizer.apply_chat_template(
        [{"role": "user", "content": req.messages[0].content}],
        tokenize=False,
        add_generation_prompt=True,
    )
    job = Job(
        req, list(tokenizer.encode(text, add_special_tokens=False)), loop, partition=partition
    )
    if req.prediction:
        job.prediction_ids = list(tokenizer.encode(req.prediction, add_special_tokens=False))
    return job


async def answer(job: Job) -> tuple[str, dict[str, Any]]:
    out = []
    while True:
        event = await asyncio.wait_for(job.events.get(), 300)
        if isinstance(event, TextDelta):
            out.append(event.text)
            continue
        assert isinstance(event, Finished), event
        spec = event.usage["speclane_spec"]
        assert isinstance(spec, dict)
        return "".join(out), spec


def batch(
    engine: BatchingEngine, requests: list[GenerationRequest], partition: str = "p"
) -> list[tuple[str, dict[str, Any]]]:
    """Answers to ``requests``, all queued at once so that they join one batch together."""

    async def run() -> list[tuple[str, dict[str, Any]]]:
        loop = asyncio.get_running_loop()
        jobs = [job_for(engine, r, loop, partition) for r in requests]
        with engine.queue._cond:  # the generation thread takes them all in one admission
            for job in jobs:
                engine.submit(job)
        return list(await asyncio.gather(*(answer(job) for job in jobs)))

    return asyncio.run(run())


def plain(engine: BatchingEngine, content: str) -> str:
    return batch(engine, [request(content, num_draft_tokens=0)])[0][0]


def test_every_source_is_lossless_and_drafts(engine: BatchingEngine) -> None:
    expected = plain(engine, EDIT)
    (pred, pred_spec), (lookup, lookup_spec) = batch(
        engine,
        [request(EDIT, prediction=expected), request(EDIT, draft_source="prompt_lookup")],
    )
    assert pred == lookup == expected
    assert pred_spec["source"] == "prediction" and lookup_spec["source"] == "prompt_lookup"
    # The whole answer was predicted: every draft token kept, in few steps.
    assert pred_spec["rejected"] == 0 and pred_spec["accepted"] >= 8
    assert lookup_spec["drafted"] > 0


def test_sequences_accepting_different_lengths_in_one_batch_are_each_exact(
    engine: BatchingEngine,
) -> None:
    expected_edit = plain(engine, EDIT)
    expected_question = plain(engine, QUESTION)
    answers = batch(
        engine,
        [
            request(EDIT, prediction=expected_edit),  # accepts nearly everything
            request(QUESTION, prediction=expected_question[:12] + WRONG),  # right, then wrong
            request(EDIT),  # does not draft
            request(QUESTION, draft_source="prompt_lookup"),
        ],
    )
    texts = [text for text, _ in answers]
    assert texts == [expected_edit, expected_question, expected_edit, expected_question]
    perfect, wrong, none, _ = (spec for _, spec in answers)
    assert perfect["accepted"] > wrong["accepted"]
    assert wrong["drafted"] > wrong["accepted"]
    assert none["drafted"] == 0 and none.get("source") is None


def test_a_row_stops_drafting_what_is_refused(engine: BatchingEngine) -> None:
    """A source that proposes a token the target never writes: with free positions every
    step drafts it; where positions cost (as a CPU measures them) the row stops after a
    few drafts. The same answer either way."""
    assert engine.models is not None
    never = len(engine.models.tokenizer.get_vocab()) - 1
    expected = plain(engine, QUESTION)
    plan, fixed = engine._plan, engine.pass_cost

    def wrong(seq: Any) -> None:
        plan(seq)
        seq.propose = lambda history, k: [never] * k
        for source in seq.chooser.candidates:  # what each step's choice drafts from
            source.propose = seq.propose

    engine._plan = wrong  # type: ignore[method-assign]
    try:
        ((free_text, free),) = batch(engine, [request(QUESTION, draft_source="prompt_lookup")])
        engine.pass_cost = PassCost(0.18)
        engine.evidence = Evidence()  # not what the refused run taught: stop within this one
        ((dear_text, dear),) = batch(engine, [request(QUESTION, draft_source="prompt_lookup")])
    finally:
        del engine._plan
        engine.pass_cost = fixed
    assert free_text == dear_text == expected
    assert free["accepted"] == dear["accepted"] == 0
    assert 0 < dear["drafted"] <= 3 * 8 < free["drafted"]


def test_the_lane_measures_its_passes(engine: BatchingEngine) -> None:
    """Measured (the default): the first plain step at a batch size is timed, then the
    verify passes: a figure for one row; the answer is plain decoding's."""
    expected = plain(engine, EDIT)
    fixed = engine.pass_cost
    try:
        engine.pass_cost = measured = PassCost()
        ((text, spec),) = batch(engine, [request(EDIT, draft_source="prompt_lookup")])
    finally:
        engine.pass_cost = fixed
    assert text == expected and spec["drafted"] > 0
    report = measured.report()["draft_position_cost"]
    assert isinstance(report, dict) and list(report) == ["1"]


def test_a_sequence_cancelled_mid_verify_leaves_the_others_exact(engine: BatchingEngine) -> None:
    expected = plain(engine, EDIT)
    drafter = engine._propose
    seen: list[int] = []

    async def run() -> tuple[Any, list[tuple[str, dict[str, Any]]]]:
        loop = asyncio.get_running_loop()
        doomed_request = request(QUESTION, draft_source="prompt_lookup", max_tokens=96)
        doomed = job_for(engine, doomed_request, loop, "p")
        others = [
            job_for(engine, request(EDIT, prediction=expected), loop, "p"),
            job_for(engine, request(EDIT, draft_source="prompt_lookup"), loop, "p"),
        ]

        def cancelling(uids: list[int], histories: list[list[int]], room: list[int]) -> Any:
            drafts = drafter(uids, histories, room)
            seen.append(len(uids))
            if len(uids) == 3:  # between the drafts and the forward pass that verifies them
                doomed.cancelled.set()
            return drafts

        engine._propose = cancelling  # type: ignore[method-assign]  # a spy around it
        with engine.queue._cond:
            for job in (doomed, *others):
                engine.submit(job)
        outcome = None
        while not isinstance(outcome, (Failed, Finished)):
            outcome = await asyncio.wait_for(doomed.events.get(), 300)
        return outcome, list(await asyncio.gather(*(answer(job) for job in others)))

    try:
        outcome, answers = asyncio.run(run())
    finally:
        del engine._propose
    assert 3 in seen  # all three were decoding together when it was cancelled
    assert isinstance(outcome, Failed) and outcome.error.code == "aborted"
    assert [text for text, _ in answers] == [expected, expected]
    assert plain(engine, EDIT) == expected  # the batch is sound afterwards


def test_suffix_drafts_from_its_own_partition_only(engine: BatchingEngine) -> None:
    engine.suffix = SuffixIndex(engine.drafts.suffix)
    ((alone_text, alone),) = batch(engine, [request(QUESTION, draft_source="suffix")], "bob")
    engine.suffix = SuffixIndex(engine.drafts.suffix)  # forget it

    ((first, _),) = batch(engine, [request(QUESTION, num_draft_tokens=0)], "alice")
    assert len(engine.suffix) == 1
    ((bob_text, bob),) = batch(engine, [request(QUESTION, draft_source="suffix")], "bob")
    # Another partition drafts from its own context alone: nothing from alice's answer.
    assert bob_text == first == alone_text
    assert (bob["drafted"], bob["accepted"]) == (alone["drafted"], alone["accepted"])
    ((alice_text, alice),) = batch(engine, [request(QUESTION, draft_source="suffix")], "alice")
    assert alice_text == first
    assert alice["source"] == "suffix"
    assert alice["accepted"] > bob["accepted"] and alice["accepted"] >= MAX_TOKENS // 2


def test_a_rows_first_token_goes_out_on_a_plain_step(engine: BatchingEngine) -> None:
    """Time to the first token is not spent verifying a draft: a sequence's first decoding
    step drafts nothing (no room), the next ones draft."""
    expected = plain(engine, EDIT)
    drafter = engine._propose
    rooms: list[int] = []

    def spy(uids: list[int], histories: list[list[int]], room: list[int]) -> Any:
        rooms.extend(room)
        return drafter(uids, histories, room)

    engine._propose = spy  # type: ignore[method-assign]
    try:
        ((text, spec),) = batch(engine, [request(EDIT, prediction=expected)])
    finally:
        del engine._propose
    assert text == expected
    assert rooms[0] == 0 and all(r > 0 for r in rooms[1:])
    assert spec["accepted"] >= 8  # drafting from the second step on
