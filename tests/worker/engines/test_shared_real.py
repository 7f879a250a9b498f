"""The shared worker (``--mode shared``) on the prepared default model: both lanes in one
process, on one copy of the model and one prompt cache (short generations, run serially)."""

from __future__ import annotations

import asyncio
import json
import threading
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import aiohttp
import openai
import pytest

from router.kernel.worker_contract import CACHE_PARTITION_HEADER, lane_prefix
from router.lanes.modelprep import DEFAULT_DRAFT_NAME, DEFAULT_MODEL_NAME
from tests.worker.conftest import BATCH_SIZE, WorkerProcess, start_worker, worker_command

pytestmark = pytest.mark.realmodel

LANES = ("speculative", "batching")
# Long enough that a cache hit is plain to see in cached_tokens.
SYSTEM = {"role": "system", "content": "You answer in one short sentence. " * 20}
FRANCE = [SYSTEM, {"role": "user", "content": "What is the capital of France?"}]
WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "The weather in a city",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string"}},
            "required": ["city"],
        },
    },
}


@pytest.fixture(scope="module")
def shared_worker(prepared_models: tuple[Path, Path]) -> Iterator[WorkerProcess]:
    """Its own: both lanes in one process (shared mode), on two threads."""
    model, draft = prepared_models
    worker = start_worker(
        worker_command(
            model,
            "shared",
            "--draft-model",
            str(draft),
            "--max-batch-size",
            str(BATCH_SIZE),
            "--shared-threads",
            "2",  # the path that needs proving; the scheduler tests cover one thread
        )
    )
    yield worker
    worker.stop()


def lane_client(worker: WorkerProcess, lane: str) -> openai.OpenAI:
    return openai.OpenAI(
        base_url=f"{worker.url}{lane_prefix(lane)}/v1", api_key="x", max_retries=0, timeout=300
    )


def get(url: str) -> dict[str, Any]:
    with urllib.request.urlopen(url, timeout=10) as r:
        return json.loads(r.read())


def test_one_process_reports_both_lanes(shared_worker: WorkerProcess) -> None:
    assert shared_worker.ready["mode"] == "shared" and shared_worker.ready["lanes"] == list(LANES)
    root = get(f"{shared_worker.url}/health")
    assert (root["mode"], root["pid"]) == ("shared", shared_worker.proc.pid)
    assert root["threads"] == 2  # each lane on its own generation thread
    for lane in LANES:
        own = get(f"{shared_worker.url}{lane_prefix(lane)}/health")
        assert own["mode"] == lane and own["pid"] == shared_worker.proc.pid
        assert root["lanes"][lane]["mode"] == lane
    spec, batch = (root["lanes"][lane] for lane in LANES)
    assert (spec["draft_model"], spec["speculative"], spec["capacity"]) == (
        DEFAULT_DRAFT_NAME,
        True,
        1,
    )
    assert (batch["draft_model"], batch["speculative"], batch["capacity"]) == (
        None,
        False,
        BATCH_SIZE,
    )
    assert spec["prompt_cache"]["max_bytes"] == batch["prompt_cache"]["max_bytes"]


@pytest.mark.parametrize("lane", LANES)
def test_both_lanes_answer_plain_and_streamed(shared_worker: WorkerProcess, lane: str) -> None:
    client = lane_client(shared_worker, lane)
    reply = client.chat.completions.create(
        model=DEFAULT_MODEL_NAME, messages=FRANCE, max_tokens=10, temperature=0
    )
    assert "Paris" in (reply.choices[0].message.content or "")
    drafted = reply.usage.model_extra["speclane_spec"]["drafted"]  # type: ignore[union-attr]
    assert (drafted > 0) == (lane == "speculative")
    text = "".join(
        chunk.choices[0].delta.content or ""
        for chunk in client.chat.completions.create(
            model=DEFAULT_MODEL_NAME, messages=FRANCE, max_tokens=10, temperature=0, stream=True
        )
        if chunk.choices
    )
    assert text == reply.choices[0].message.content


def test_a_prefix_cached_through_one_lane_is_found_by_the_other(
    shared_worker: WorkerProcess,
) -> None:
    """Turns alternate between lanes: each finds the conversation so far in the one cache."""
    fresh = {"role": "system", "content": "You name things, one word each time. " * 20}
    messages: list[Any] = [fresh, {"role": "user", "content": "Name a colour."}]
    cached = []
    for turn, lane in enumerate(("speculative", "batching", "speculative")):
        reply = lane_client(shared_worker, lane).chat.completions.create(
            model=DEFAULT_MODEL_NAME, messages=messages, max_tokens=6, temperature=0
        )
        details = reply.usage.prompt_tokens_details  # type: ignore[union-attr]
        cached.append((details.cached_tokens if details else 0, reply.usage.prompt_tokens))  # type: ignore[union-attr]
        messages += [
            {"role": "assistant", "content": reply.choices[0].message.content or ""},
            {"role": "user", "content": f"And another one ({turn})?"},
        ]
    first, *later = cached
    assert first[0] < 10  # at most the chat template's opening, shared with earlier prompts
    for hit, prompt in later:  # everything but the new turn came from the other lane's entry
        assert prompt - 40 < hit < prompt


def test_tools_and_prediction_work_on_both_lanes(shared_worker: WorkerProcess) -> None:
    for lane in LANES:
        reply = lane_client(shared_worker, lane).chat.completions.create(
            model=DEFAULT_MODEL_NAME,
            max_tokens=40,
            temperature=0,
            tools=[WEATHER],  # type: ignore[list-item]
            tool_choice={"type": "function", "function": {"name": "get_weather"}},
            messages=[{"role": "user", "content": "What is the weather in Paris?"}],
        )
        calls = reply.choices[0].message.tool_calls or []
        assert [c.function.name for c in calls] == ["get_weather"], lane  # type: ignore[union-attr]
        assert "city" in json.loads(calls[0].function.arguments)  # type: ignore[union-attr]
    messages = [{"role": "user", "content": "Write a Python function that adds two numbers."}]
    spec = lane_client(shared_worker, "speculative")
    plain = spec.chat.completions.create(
        model=DEFAULT_MODEL_NAME,
        messages=messages,
        max_tokens=16,
        temperature=0,
        extra_body={"num_draft_tokens": 0},
    )
    text = plain.choices[0].message.content or ""
    predicted = spec.chat.completions.create(
        model=DEFAULT_MODEL_NAME,
        messages=messages,
        max_tokens=16,
        temperature=0,
        prediction={"type": "content", "content": text.replace("add", "sum", 1)},
    )
    assert predicted.choices[0].message.content == text  # lossless
    assert predicted.usage.model_extra["speclane_spec"]["source"] == "prediction"  # type: ignore[union-attr]
    details = predicted.usage.completion_tokens_details  # type: ignore[union-attr]
    assert details is not None and (details.accepted_prediction_tokens or 0) > 0


def test_the_speculative_lane_keeps_its_turns_while_the_batch_decodes(
    shared_worker: WorkerProcess,
) -> None:
    """Requests on both lanes at once all finish, and both lanes took turns in between."""
    before = get(f"{shared_worker.url}/health")["turns"]
    errors: list[BaseException] = []

    def ask(lane: str) -> None:
        try:
            reply = lane_client(shared_worker, lane).chat.completions.create(
                model=DEFAULT_MODEL_NAME, messages=FRANCE, max_tokens=12, temperature=0
            )
            assert "Paris" in (reply.choices[0].message.content or "")
        except BaseException as e:  # reported below, in the test's thread
            errors.append(e)

    threads = [
        threading.Thread(target=ask, args=(lane,))
        for lane in ("batching", "batching", "speculative", "speculative")
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join(300)
    assert not errors, errors
    after = get(f"{shared_worker.url}/health")["turns"]
    assert after["speculative"] > before["speculative"]
    assert after["batching"] > before["batching"]


# A generation that cannot end early: both end-of-text tokens are banned (SmolLM2: 0 and 2).
ENDLESS = {
    "prompt": "Once upon a time",
    "max_tokens": 4096,
    "logit_bias": {"0": -100, "2": -100},
    "stream": True,
}


@pytest.mark.parametrize("lane", LANES)
async def test_a_client_disconnect_stops_its_lane_only(
    shared_worker: WorkerProcess, lane: str
) -> None:
    lane_url = f"{shared_worker.url}{lane_prefix(lane)}"
    async with aiohttp.ClientSession() as session:
        response = await session.post(f"{lane_url}/v1/completions", json=ENDLESS)
        assert (await response.content.readline()).startswith(b"data: ")
        assert get(f"{lane_url}/health")["active"] == 1
        response.close()
        for _ in range(600):  # the generation thread sees the cancel within one turn
            if get(f"{lane_url}/health")["active"] == 0:
                break
            await asyncio.sleep(0.05)
    assert get(f"{lane_url}/health")["active"] == 0
    again = lane_client(shared_worker, lane).completions.create(
        model=DEFAULT_MODEL_NAME, prompt="Hi", max_tokens=2
    )
    assert again.usage is not None and again.usage.completion_tokens >= 1


@pytest.mark.parametrize("lane", LANES)
def test_stop_strings_and_a_json_schema_hold_on_both_lanes(
    shared_worker: WorkerProcess, lane: str
) -> None:
    client = lane_client(shared_worker, lane)
    counting = [{"role": "user", "content": "Count from 1 to 20, separated by commas."}]
    stopped = client.chat.completions.create(
        model=DEFAULT_MODEL_NAME, messages=counting, max_tokens=40, temperature=0, stop=["5"]
    )
    text = stopped.choices[0].message.content or ""
    assert "5" not in text and "4" in text and stopped.choices[0].finish_reason == "stop"
    schema = {
        "type": "object",
        "properties": {"city": {"type": "string", "maxLength": 12}},
        "required": ["city"],
        "additionalProperties": False,
    }
    shaped = client.chat.completions.create(
        model=DEFAULT_MODEL_NAME,
        max_tokens=30,
        temperature=0,
        messages=[{"role": "user", "content": "Which city is the capital of France?"}],
        response_format={
            "type": "json_schema",  # type: ignore[typeddict-item]
            "json_schema": {"name": "answer", "schema": schema},
        },
    )
    assert set(json.loads(shaped.choices[0].message.content or "")) == {"city"}


def test_the_speculative_lane_drafts_by_prompt_lookup_on_request(
    shared_worker: WorkerProcess,
) -> None:
    code = "".join(f"def f{i}(x):\n    return x + {i}\n" for i in range(5))
    reply = lane_client(shared_worker, "speculative").chat.completions.create(
        model=DEFAULT_MODEL_NAME,
        max_tokens=12,
        temperature=0,
        messages=[{"role": "user", "content": f"Repeat this code exactly:\n{code}"}],
        extra_body={"draft_source": "prompt_lookup"},
        # a partition of its own: nothing another test's requests taught is carried here
        extra_headers={CACHE_PARTITION_HEADER: "5eed" * 6},
    )
    spec = reply.usage.model_extra["speclane_spec"]  # type: ignore[union-attr]
    assert spec["source"] == "prompt_lookup" and spec["drafted"] > 0


QUESTIONS = (
    "What is the capital of France?",
    "Name three colours.",
    "Write a Python function that adds two numbers.",
    "Count from 1 to 10.",
)


def lane_answers(worker: WorkerProcess, lane: str) -> list[str]:
    """One client on ``lane``: its questions one after the other (greedy, plus one seeded
    sampled request), all with one system prompt, so cache entries cross between lanes."""
    client = lane_client(worker, lane)
    answers = []
    for i, question in enumerate(QUESTIONS):
        extra = {"draft_source": "prompt_lookup"} if lane == "speculative" and i % 2 else {}
        reply = client.chat.completions.create(
            model=DEFAULT_MODEL_NAME,
            messages=[SYSTEM, {"role": "user", "content": question}],
            max_tokens=16,
            temperature=0,
            extra_body=extra,
        )
        answers.append(reply.choices[0].message.content or "")
    seeded = client.chat.completions.create(
        model=DEFAULT_MODEL_NAME,
        messages=[SYSTEM, {"role": "user", "content": "Tell me a story."}],
        max_tokens=16,
        temperature=0.9,
        seed=7,
    )
    answers.append(seeded.choices[0].message.content or "")
    return answers


def test_both_lanes_decoding_at_once_answer_what_each_answers_alone(
    shared_worker: WorkerProcess,
) -> None:
    """A stress of the two generation threads: each lane's answers (greedy, and seeded
    sampling, whose random key is per thread) while the other lane decodes are those it gives
    alone; nothing leaks or breaks between them."""
    alone = {lane: lane_answers(shared_worker, lane) for lane in LANES}
    assert all(alone[lane][:4] for lane in LANES)
    rounds = 1  # that the two runs overlapped is asserted below
    together: dict[str, list[str]] = {lane: [] for lane in LANES}
    spans: dict[str, tuple[float, float]] = {}
    errors: list[BaseException] = []
    start = threading.Barrier(len(LANES))

    def client(lane: str) -> None:
        try:
            start.wait(30)
            began = time.monotonic()
            for _ in range(rounds):
                together[lane] += lane_answers(shared_worker, lane)
            spans[lane] = (began, time.monotonic())
        except BaseException as e:  # reported below, in the test's thread
            errors.append(e)

    threads = [threading.Thread(target=client, args=(lane,)) for lane in LANES]
    for t in threads:
        t.start()
    for t in threads:
        t.join(900)
    assert not errors, errors
    (b1, e1), (b2, e2) = spans.values()
    assert b1 < e2 and b2 < e1, "the lanes never decoded at the same time"
    for lane in LANES:
        assert together[lane] == alone[lane] * rounds, lane
    assert shared_worker.proc.poll() is None
