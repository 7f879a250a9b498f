"""The draft chosen at every step, on the real default model (in-process speculative engine
with its draft model): lossless whatever is chosen; a copying answer drafts from a free
source; the default draft (the target's size) is never drafted from under ``auto``, while a
draft model that costs little is."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from router.worker.drafting.draftchoice import DraftCost
from router.worker.engines.engine import Models
from router.worker.engines.speculative import SpeculativeConfig, SpeculativeEngine
from tests.worker.engine_run import answer_once

pytestmark = pytest.mark.realmodel

MAX_TOKENS = 40
CODE = "def area(w, h):\n    return w * h\n\n\ndef perimeter(w, h):\n    return 2 * (w + h)\n"
COPY = f"Here is shapes.py:\n```python\n{CODE}```\nRepeat the file exactly, in a code block."
CHAT = "Tell me a short story about a cat."


@pytest.fixture(scope="module")
def engine(loaded_models: tuple[Any, Any, Any]) -> Iterator[SpeculativeEngine]:
    def load_models() -> Models:
        return Models(*loaded_models)  # the session's (evaluated: shareable)

    engine = SpeculativeEngine(load_models, SpeculativeConfig(draft_source="auto"))
    engine.start()
    yield engine
    engine.stop(30)


def run(
    engine: SpeculativeEngine, text: str, partition: str, **fields: Any
) -> tuple[str, dict[str, Any]]:
    return answer_once(engine, text, partition, MAX_TOKENS, **fields)


def test_the_draft_model_is_timed_before_the_first_request(engine: SpeculativeEngine) -> None:
    """A lane with a draft model calibrates as it starts, so that its first request does
    not wait for that (this module's first test: nothing has decoded yet)."""
    assert engine.calibrated.wait(60)
    assert engine.progress_tokens == 0
    assert engine.draft_cost.gamma is not None and engine.draft_cost.gamma > 0.3
    assert engine.pass_cost.plain(1) is not None


def test_auto_copies_from_a_free_source_and_never_from_a_draft_as_slow_as_the_target(
    engine: SpeculativeEngine,
) -> None:
    plain, _ = run(engine, COPY, "p-plain", num_draft_tokens=0)
    out, spec = run(engine, COPY, "p-copy")
    assert out == plain
    assert spec["source"] == "auto"
    sources = spec["sources"]
    assert "draft_model" not in sources  # same size as the target: it cannot pay
    assert sum(s["accepted"] for s in sources.values()) > 0
    report = engine.report()
    assert isinstance(report["draft_model_cost"], float) and report["draft_model_cost"] > 0.3
    # What this turn taught is carried to the partition's next one.
    assert engine.evidence.acceptance("p-copy", "prompt_lookup").alpha != pytest.approx(0.5)


def test_a_cheap_draft_model_drafts_chat_and_stays_lossless(engine: SpeculativeEngine) -> None:
    plain, _ = run(engine, CHAT, "c-plain", num_draft_tokens=0)
    measured = engine.draft_cost
    engine.draft_cost = DraftCost(0.02)  # as a small draft for a large target would cost
    try:
        out, spec = run(engine, CHAT, "c-cheap")
    finally:
        engine.draft_cost = measured
    assert out == plain
    assert spec["sources"].get("draft_model", {}).get("drafted", 0) > 0
