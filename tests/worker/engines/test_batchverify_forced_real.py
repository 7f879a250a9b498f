"""Constrained sequences drafting on the batching lane, on the real default model
(in-process): a batch mixing a tool call, a ``json_schema`` answer and a free answer writes
each one's plain (``num_draft_tokens: 0``) decoding, the grammar's forced tokens counted; a
constrained sequence cancelled between its draft and the verify pass leaves the others
exact; a constraint failing mid-answer still ends that answer with ``constraint_failed``."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from typing import Any

import pytest

from router.worker.drafting.draftlength import BatchDraftSettings
from router.worker.drafting.forced import Draft
from router.worker.engines.batching import BatchingEngine
from router.worker.engines.engine import Models
from router.worker.engines.jobs import Event, Failed, Finished, Job, TextDelta
from router.worker.http.server import prepare
from router.worker.request.protocol import parse_generation_request
from tests.worker.decoding.test_constrain import MANY_SHAPES

pytestmark = pytest.mark.realmodel

WEATHER_TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string"}, "unit": {"enum": ["celsius", "fahrenheit"]}},
            "required": ["city", "unit"],
        },
    },
}
TOOL_CALL = {"tools": [WEATHER_TOOL], "tool_choice": "required"}
JSON_SCHEMA = {
    "response_format": {
        "type": "json_schema",
        "json_schema": {
            "name": "person",
            "schema": {
                "type": "object",
                "properties": {"name": {"type": "string"}, "age": {"type": "integer"}},
                "required": ["name", "age"],
            },
        },
    }
}
# Passes the compile-time probe (it walks 32 one-character tokens into the free string) and
# fails once the answer reaches "x": the string's length bound closes it by then.
LATE_FAILURE = {
    "response_format": {
        "type": "json_schema",
        "json_schema": {
            "name": "late",
            "schema": {
                "type": "object",
                "properties": {
                    "s": {"type": "string", "maxLength": 40},
                    "x": {"anyOf": MANY_SHAPES},
                },
                "required": ["s", "x"],
            },
        },
    }
}
WEATHER = "What is the weather in Paris? Tom is 31 years old."
QUESTION = "Write a short Python function that returns the largest of a list of numbers."
MAX_TOKENS = 40


@pytest.fixture(scope="module")
def engine(loaded_models: tuple[Any, Any, Any]) -> Iterator[BatchingEngine]:
    def load_models() -> Models:
        model, tokenizer, _ = loaded_models  # the session's (evaluated: shareable)
        return Models(model, tokenizer)

    engine = BatchingEngine(load_models, 4, drafts=BatchDraftSettings())
    engine.start()
    yield engine
    engine.stop(30)


def body(content: str, fields: dict[str, Any], **more: Any) -> dict[str, Any]:
    return {
        "messages": [{"role": "user", "content": content}],
        "temperature": 0,
        "max_tokens": MAX_TOKENS,
        **fields,
        **more,
    }


def job_for(engine: BatchingEngine, request: dict[str, Any], loop: Any) -> Job:
    """A job as the worker's server makes it: the prompt rendered, the constraint compiled."""
    assert engine.models is not None
    prepared = prepare(engine.models.tokenizer, parse_generation_request(request, "chat"))
    return Job(prepared.generation, prepared.prompt_ids, loop, partition="p")


async def outcome(job: Job) -> tuple[str, Event]:
    out = []
    while True:
        event = await asyncio.wait_for(job.events.get(), 300)
        if isinstance(event, TextDelta):
            out.append(event.text)
            continue
        assert isinstance(event, (Finished, Failed)), event
        return "".join(out), event


def batch(engine: BatchingEngine, requests: list[dict[str, Any]]) -> list[tuple[str, Event]]:
    """Outcomes of ``requests``, all queued at once so that they join one batch together."""

    async def run() -> list[tuple[str, Event]]:
        loop = asyncio.get_running_loop()
        jobs = [job_for(engine, r, loop) for r in requests]
        with engine.queue._cond:  # the generation thread takes them all in one admission
            for job in jobs:
                engine.submit(job)
        return list(await asyncio.gather(*(outcome(job) for job in jobs)))

    return asyncio.run(run())


def spec_of(event: Event) -> dict[str, Any]:
    assert isinstance(event, Finished), event
    spec = event.usage["speclane_spec"]
    assert isinstance(spec, dict)
    return spec


def plain_texts(engine: BatchingEngine, requests: list[dict[str, Any]]) -> list[str]:
    answers = batch(engine, [{**r, "num_draft_tokens": 0} for r in requests])
    for _, event in answers:
        assert spec_of(event)["drafted"] == 0
    return [text for text, _ in answers]


def test_a_mixed_batch_writes_each_rows_plain_decoding_and_counts_forced_tokens(
    engine: BatchingEngine,
) -> None:
    requests = [
        body(WEATHER, TOOL_CALL),
        body(WEATHER, JSON_SCHEMA, draft_source="prompt_lookup"),
        body(QUESTION, {}, draft_source="prompt_lookup"),
    ]
    expected = plain_texts(engine, requests)
    assert expected[0].startswith("<tool_call>") and expected[1].startswith('{"name": ')
    answers = batch(engine, requests)
    assert [text for text, _ in answers] == expected
    tool, schema, free = (spec_of(event) for _, event in answers)
    assert tool["source"] == "forced" and tool["forced"] > 0  # no source: forced tokens only
    assert schema["source"] == "prompt_lookup" and schema["forced"] > 0
    assert free["source"] == "prompt_lookup" and free["forced"] == 0
    for spec in (tool, schema):
        assert spec["accepted"] >= spec["forced"] and spec["drafted"] >= spec["accepted"]


def test_a_constrained_row_cancelled_between_draft_and_verify_leaves_the_others_exact(
    engine: BatchingEngine,
) -> None:
    others = [
        body(WEATHER, TOOL_CALL, draft_source="prompt_lookup"),
        body(QUESTION, {}, draft_source="prompt_lookup"),
    ]
    expected = plain_texts(engine, others)
    drafter = engine._propose
    cancelled_after: list[Draft] = []

    async def run() -> tuple[Event, list[tuple[str, Event]]]:
        loop = asyncio.get_running_loop()
        doomed = job_for(engine, body(WEATHER, TOOL_CALL, max_tokens=96), loop)
        jobs = [job_for(engine, r, loop) for r in others]

        def cancelling(uids: list[int], histories: list[list[int]], room: list[int]) -> Any:
            drafts = drafter(uids, histories, room)
            mine = [
                d for uid, d in zip(uids, drafts, strict=True) if engine._live[uid].job is doomed
            ]
            if len(uids) >= 2 and mine and isinstance(mine[0], Draft) and mine[0].tokens:
                doomed.cancelled.set()  # its draft made, the forward pass not yet run
                if not cancelled_after:
                    cancelled_after.append(mine[0])
            return drafts

        engine._propose = cancelling  # type: ignore[method-assign]  # a spy around it
        with engine.queue._cond:
            for job in (doomed, *jobs):
                engine.submit(job)
        _, ended = await outcome(doomed)
        return ended, list(await asyncio.gather(*(outcome(job) for job in jobs)))

    try:
        ended, answers = asyncio.run(run())
    finally:
        del engine._propose
    assert cancelled_after  # cancelled holding a draft of forced tokens, others decoding
    assert isinstance(ended, Failed) and ended.error.code == "aborted"
    assert [text for text, _ in answers] == expected
    assert plain_texts(engine, others) == expected  # the batch is sound afterwards


def test_a_constraint_failing_mid_answer_still_ends_with_constraint_failed(
    engine: BatchingEngine,
) -> None:
    failing = body(WEATHER, LATE_FAILURE, max_tokens=80)
    free = body(QUESTION, {}, draft_source="prompt_lookup")
    expected_free = plain_texts(engine, [free])[0]
    for drafting in (False, True):  # today's plain constrained decoding, then drafting
        asked = failing if drafting else {**failing, "num_draft_tokens": 0}
        (text, ended), (free_text, free_ended) = batch(engine, [asked, free])
        assert isinstance(ended, Failed) and ended.error.code == "constraint_failed", drafting
        assert ended.error.param == "response_format"
        assert text.startswith('{"s": "')
        assert free_text == expected_free and isinstance(free_ended, Finished)


def test_sampled_constrained_rows_drafting_together_follow_their_grammars(
    engine: BatchingEngine,
) -> None:
    import orjson

    # Strings bounded, so that every sampled answer ends well within max_tokens.
    short = {"type": "string", "maxLength": 16}
    tool = {
        "type": "function",
        "function": {
            "name": "get_weather",
            "parameters": {
                "type": "object",
                "properties": {"city": short, "unit": {"enum": ["celsius", "fahrenheit"]}},
                "required": ["city", "unit"],
            },
        },
    }
    person = {
        "type": "object",
        "properties": {"name": short, "age": {"type": "integer", "maximum": 999}},
        "required": ["name", "age"],
    }
    schema = {
        "response_format": {"type": "json_schema", "json_schema": {"name": "p", "schema": person}}
    }
    sampled = {"temperature": 0.9, "seed": 7, "max_tokens": 96}
    answers = batch(
        engine,
        [
            body(WEATHER, {"tools": [tool], "tool_choice": "required"}, **sampled),
            body(WEATHER, schema, **sampled),
        ],
    )
    (call, call_end), (document, document_end) = answers
    assert call.startswith("<tool_call>\n") and call.endswith("\n</tool_call>"), call
    parsed = orjson.loads(call.removeprefix("<tool_call>\n").removesuffix("\n</tool_call>"))
    assert parsed["name"] == "get_weather"
    assert parsed["arguments"]["unit"] in ("celsius", "fahrenheit")
    written = orjson.loads(document)
    assert set(written) == {"name", "age"} and isinstance(written["age"], int)
    assert spec_of(call_end)["forced"] > 0 and spec_of(document_end)["forced"] > 0
