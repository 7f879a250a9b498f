"""The draft chosen at every step, on the real default model (in-process speculative engine
with its draft model): lossless whatever is chosen; a copying answer drafts from a free
source; the default draft (the target's size) is never drafted from under ``auto``, while a
draft model that costs little is."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from router.worker.draftchoice import DraftCost
from router.worker.engine import Models
from router.worker.jobs import Finished, Job, TextDelta
from router.worker.protocol import GenerationRequest, Message
from router.worker.speculative import SpecSettings, SpeculativeEngine

pytestmark = pytest.mark.realmodel

MAX_TOKENS = 40
CODE = "def area(w, h):\n    return w * h\n\n\ndef perimeter(w, h):\n    return 2 * (w + h)\n"
COPY = f"Here is shapes.py:\n```python\n{CODE}```\nRepeat the file exactly, in a code block."
CHAT = "Tell me a short story about a cat."


@pytest.fixture(scope="module")
def engine(prepared_models: tuple[Path, Path]) -> Iterator[SpeculativeEngine]:
    from mlx_lm import load

    def load_models() -> Models:
        model, tokenizer = load(str(prepared_models[0]))
        draft, _ = load(str(prepared_models[1]))
        return Models(model, tokenizer, draft)

    engine = SpeculativeEngine(load_models, SpecSettings(draft_source="auto"))
    engine.start()
    yield engine
    engine.stop(30)


def run(
    engine: SpeculativeEngine, text: str, partition: str, **fields: Any
) -> tuple[str, dict[str, Any]]:
    assert engine.models is not None
    tokenizer = engine.models.tokenizer
    rendered = tokenizer.apply_chat_template(
        [{"role": "user", "content": text}], tokenize=False, add_generation_prompt=True
    )
    prompt = list(tokenizer.encode(rendered, add_special_tokens=False))
    request = GenerationRequest(
        kind="chat",
        messages=(Message("user", text),),
        temperature=0.0,
        max_tokens=MAX_TOKENS,
        **fields,
    )

    async def answer() -> tuple[str, dict[str, Any]]:
        job = Job(request, prompt, asyncio.get_running_loop(), partition=partition)
        engine.submit(job)
        out = []
        while True:
            event = await asyncio.wait_for(job.events.get(), 300)
            if isinstance(event, TextDelta):
                out.append(event.text)
            else:
                assert isinstance(event, Finished), event
                spec = event.usage["speclane_spec"]
                assert isinstance(spec, dict)
                return "".join(out), spec

    return asyncio.run(answer())


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
