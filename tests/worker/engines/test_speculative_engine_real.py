"""The speculative engine on the real default model (in-process): the ``suffix`` source
(lossless, a repeated prompt drafts from the earlier answer, only within its partition) and
a constrained request's forced tokens (reported in ``usage``)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from router.worker.drafting.suffix import SuffixIndex
from router.worker.engines.engine import Models
from router.worker.engines.speculative import SpeculativeConfig, SpeculativeEngine
from tests.worker.engine_run import answer_once

pytestmark = pytest.mark.realmodel

MAX_TOKENS = 32
QUESTION = "Write a short Python function that returns the sum of a list of numbers."


@pytest.fixture(scope="module")
def engine(loaded_models: tuple[Any, Any, Any]) -> Iterator[SpeculativeEngine]:
    def load_models() -> Models:
        model, tokenizer, _ = loaded_models  # the session's (evaluated: shareable)
        return Models(model, tokenizer)

    engine = SpeculativeEngine(load_models, SpeculativeConfig(draft_source="none"))
    engine.start()
    yield engine
    engine.stop(30)


def run(
    engine: SpeculativeEngine, partition: str, source: str | None, **fields: Any
) -> tuple[str, dict[str, Any]]:
    """One greedy answer to QUESTION: its text and its ``speclane_spec`` usage."""
    return answer_once(engine, QUESTION, partition, MAX_TOKENS, draft_source=source, **fields)


def test_suffix_drafts_a_repeat_from_the_earlier_answer_of_its_own_partition_only(
    engine: SpeculativeEngine,
) -> None:
    # What the request drafts from its own context alone, with nothing indexed.
    alone_text, alone = run(engine, "bob", "suffix")
    engine.suffix = SuffixIndex(engine.settings.suffix)  # forget it

    plain_text, plain = run(engine, "alice", None)  # indexed under alice's partition
    assert plain["drafted"] == 0 and len(engine.suffix) == 1

    bob_text, bob = run(engine, "bob", "suffix")
    assert bob_text == plain_text == alone_text  # lossless
    # Another partition: exactly the drafts of its own context, nothing from alice's answer.
    assert (bob["drafted"], bob["accepted"], bob["steps"]) == (
        alone["drafted"],
        alone["accepted"],
        alone["steps"],
    )

    alice_text, alice = run(engine, "alice", "suffix")
    assert alice_text == plain_text
    assert alice["source"] == "suffix"
    # The retry drafts its whole answer from the first one.
    assert alice["accepted"] > bob["accepted"]
    assert alice["accepted"] >= MAX_TOKENS // 2
    assert engine.report()["suffix_index"]["entries"] == 3  # type: ignore[index]


def test_a_constrained_answer_drafts_its_forced_tokens(engine: SpeculativeEngine) -> None:
    schema = (
        '{"type":"object","properties":{"function_name":{"type":"string"},'
        '"language":{"const":"python"}},"required":["function_name","language"]}'
    )
    fields = {"response_format": "json_schema", "response_schema": schema}
    plain_text, plain = run(engine, "carol", None, num_draft_tokens=0, **fields)
    text, spec = run(engine, "carol", None, **fields)
    assert text == plain_text and text.startswith('{"function_name": "')
    assert plain["drafted"] == 0
    assert spec["source"] == "forced" and spec["forced"] > 0
    assert spec["forced"] == spec["accepted"]  # no other source: every kept draft was forced
