"""One greedy answer from an in-process engine on the real model (the realmodel tests)."""

from __future__ import annotations

import asyncio
import dataclasses
from typing import Any

from router.worker.decoding.constrain import COMPILER
from router.worker.engines.engine import Engine
from router.worker.engines.jobs import Finished, Job, TextDelta
from router.worker.request.protocol import GenerationRequest, Message


def answer_once(
    engine: Engine, question: str, partition: str, max_tokens: int, **fields: Any
) -> tuple[str, dict[str, Any]]:
    """The answer to one user ``question``: its text and its ``speclane_spec`` usage;
    ``partition`` is what the X-Speclane-Cache-Partition header sets."""
    assert engine.models is not None
    tokenizer = engine.models.tokenizer
    text = tokenizer.apply_chat_template(
        [{"role": "user", "content": question}], tokenize=False, add_generation_prompt=True
    )
    prompt = list(tokenizer.encode(text, add_special_tokens=False))
    request = GenerationRequest(
        kind="chat",
        messages=(Message("user", question),),
        temperature=0.0,
        max_tokens=max_tokens,
        **fields,
    )
    if request.response_format != "text":
        request = dataclasses.replace(request, constraint=COMPILER.compile(request, tokenizer))

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
