"""The batching lane's prompt cache and chunked prefill, on the real default model.

Assertions are on outputs, counters and the order of events, never on measured times.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from router.lanes.modelprep import DEFAULT_MODEL_NAME as MODEL
from tests.worker.conftest import WorkerProcess, start_worker, worker_command
from tests.worker.test_worker_real import client, health, wait_for

pytestmark = pytest.mark.realmodel

STEP = 16  # prompt tokens per prefill chunk: many chunks for a modest prompt
SYSTEM = "You are a careful coding assistant. " + " ".join(
    f"Rule {i}: read a file before editing it." for i in range(12)
)
# A generation that cannot end early: both end-of-text tokens are banned (SmolLM2: 0 and 2).
NO_EOS = {"0": -100, "2": -100}


def long_prompt(topic: str, lines: int = 40) -> str:
    """About 10 tokens a line; ``topic`` keeps prompts of different tests apart in the cache."""
    return "\n".join(f"{topic} note {i}: the build passed and the tests ran." for i in range(lines))


@pytest.fixture(scope="module")
def cached_worker(prepared_models: tuple[Path, Path]) -> Iterator[WorkerProcess]:
    """Its own: prefill in steps of ``STEP`` tokens (a long prompt takes several)."""
    model, _ = prepared_models
    worker = start_worker(
        worker_command(model, "batching", "--max-batch-size", "4", "--prefill-step-size", str(STEP))
    )
    yield worker
    worker.stop()


@pytest.fixture(scope="module")
def uncached_worker(prepared_models: tuple[Path, Path]) -> Iterator[WorkerProcess]:
    """Its own: no prompt cache."""
    model, _ = prepared_models
    worker = start_worker(worker_command(model, "batching", "--prompt-cache-bytes", "0"))
    yield worker
    worker.stop()


def cached_tokens(usage: Any) -> int:
    return int(usage.prompt_tokens_details.cached_tokens)


def test_a_shared_prefix_is_reused_and_gives_the_same_greedy_answer(
    cached_worker: WorkerProcess, uncached_worker: WorkerProcess
) -> None:
    first = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": "What is 2+2?"}]
    turn1 = client(cached_worker).chat.completions.create(
        model=MODEL, messages=first, max_tokens=8, temperature=0
    )  # type: ignore[arg-type]
    assert turn1.usage is not None and cached_tokens(turn1.usage) == 0
    second = [
        *first,
        {"role": "assistant", "content": turn1.choices[0].message.content},
        {"role": "user", "content": "And 3+3?"},
    ]
    kwargs: dict[str, Any] = {"messages": second, "max_tokens": 8, "temperature": 0}
    cached = client(cached_worker).chat.completions.create(model=MODEL, **kwargs)
    plain = client(uncached_worker).chat.completions.create(model=MODEL, **kwargs)
    assert cached.usage is not None and plain.usage is not None
    # The whole first turn (system prompt, question, answer) is reused.
    assert cached_tokens(cached.usage) >= turn1.usage.prompt_tokens
    assert cached_tokens(plain.usage) == 0
    assert cached.usage.prompt_tokens == plain.usage.prompt_tokens
    assert cached.choices[0].message.content == plain.choices[0].message.content
    stats = health(cached_worker)["prompt_cache"]
    assert stats["hits"] >= 1 and stats["reused_tokens"] >= cached_tokens(cached.usage)
    assert 0 < stats["bytes"] <= stats["max_bytes"]
    assert health(uncached_worker)["prompt_cache"]["entries"] == 0


def test_a_new_conversation_reuses_the_system_prompt_of_an_earlier_one(
    cached_worker: WorkerProcess,
) -> None:
    """mlx_lm.server keeps a separate entry for the system prompt; here the nearest longer
    entry (an earlier conversation) is trimmed back to the shared prefix, which gives a new
    conversation with the same system prompt the same reuse."""
    system = SYSTEM + " Answer in one short sentence."
    first = [{"role": "system", "content": system}, {"role": "user", "content": "Name a fruit."}]
    turn = client(cached_worker).chat.completions.create(
        model=MODEL, messages=first, max_tokens=6, temperature=0
    )  # type: ignore[arg-type]
    assert turn.usage is not None
    other = [
        {"role": "system", "content": system},
        {"role": "user", "content": "Which colour is the sky?"},
    ]
    fresh = client(cached_worker).chat.completions.create(
        model=MODEL, messages=other, max_tokens=6, temperature=0
    )  # type: ignore[arg-type]
    assert fresh.usage is not None
    # At least the system prompt's tokens come from the first conversation's entry; not the
    # whole of it (the user messages differ).
    system_tokens = len(system) // 8
    assert system_tokens <= cached_tokens(fresh.usage) < turn.usage.prompt_tokens


async def stream_completion(
    session: aiohttp.ClientSession,
    worker: WorkerProcess,
    body: dict[str, Any],
    on_text: Any,
) -> None:
    payload = {"model": MODEL, "stream": True, "temperature": 0, **body}
    async with session.post(f"{worker.url}/v1/completions", json=payload) as resp:
        assert resp.status == 200, await resp.text()
        async for raw in resp.content:
            line = raw.strip()
            if not line.startswith(b"data: ") or line == b"data: [DONE]":
                continue
            chunk = json.loads(line[6:])
            if chunk["choices"] and chunk["choices"][0]["text"]:
                on_text()


async def test_a_running_stream_keeps_producing_tokens_while_a_long_prompt_prefills(
    cached_worker: WorkerProcess,
) -> None:
    events: list[str] = []
    a_tokens = asyncio.Event()

    def on_a() -> None:
        events.append("a")
        if events.count("a") >= 2:
            a_tokens.set()

    async with aiohttp.ClientSession() as session:
        a = asyncio.create_task(
            stream_completion(
                session,
                cached_worker,
                {"prompt": "Once upon a time", "max_tokens": 2000, "logit_bias": NO_EOS},
                on_a,
            )
        )
        await asyncio.wait_for(a_tokens.wait(), 120)
        before = health(cached_worker)["prefill_tokens"]
        b = asyncio.create_task(
            stream_completion(
                session,
                cached_worker,
                {"prompt": long_prompt("interleave"), "max_tokens": 1},
                lambda: events.append("b-first-token"),
            )
        )
        await wait_for(
            cached_worker,
            lambda h: h["prefill_tokens"] > before + 1,
            "the long prompt's prefill to start",
        )
        events.append("b-prefill-started")
        await asyncio.wait_for(b, 300)
        a.cancel()
        await asyncio.gather(a, return_exceptions=True)
    start, end = events.index("b-prefill-started"), events.index("b-first-token")
    # ~400 prompt tokens in chunks of 16: one decoding step of A between every two chunks.
    # Prefilled in one piece, A would get at most a token or two in this window.
    assert events[start:end].count("a") >= 5, events


async def test_cancelling_during_a_long_prefill_frees_the_lane_and_keeps_the_work(
    cached_worker: WorkerProcess,
) -> None:
    await wait_for(cached_worker, lambda h: h["active"] == 0, "an idle lane")
    before = health(cached_worker)["prefill_tokens"]
    prompt = long_prompt("cancel", lines=60)
    async with aiohttp.ClientSession() as session:
        long = asyncio.create_task(
            stream_completion(
                session, cached_worker, {"prompt": prompt, "max_tokens": 4}, lambda: None
            )
        )
        await wait_for(
            cached_worker, lambda h: h["prefill_tokens"] > before, "the prefill to start"
        )
        long.cancel()  # the client goes away mid-prefill
        await asyncio.gather(long, return_exceptions=True)
    freed = await wait_for(
        cached_worker, lambda h: h["active"] == 0 and h["queued"] == 0, "the lane to be free again"
    )
    answer = client(cached_worker).completions.create(
        model=MODEL, prompt="The capital of France is", max_tokens=3, temperature=0
    )
    assert answer.choices[0].text
    # The part prefilled before the cancel went to the prompt cache: a retry resumes there.
    retry = client(cached_worker).completions.create(
        model=MODEL, prompt=prompt, max_tokens=1, temperature=0
    )
    assert retry.usage is not None
    assert freed["prefill_tokens"] - before < retry.usage.prompt_tokens, "the prefill ran on"
    assert 0 < cached_tokens(retry.usage) < retry.usage.prompt_tokens


def test_prompt_cache_off_still_reports_zero_cached_tokens(
    uncached_worker: WorkerProcess,
) -> None:
    for _ in range(2):
        answer = client(uncached_worker).completions.create(
            model=MODEL, prompt="Hello there", max_tokens=2, temperature=0
        )
        assert answer.usage is not None and cached_tokens(answer.usage) == 0


def test_n_choices_decode_from_one_prefill(batch_worker: WorkerProcess) -> None:
    """``n=2``: the first choice prefills the prompt, the second starts from its KV state in
    the prompt cache (a few tokens prefilled, not the prompt again); greedy ones alike."""
    messages = [{"role": "user", "content": long_prompt("n-choices", 8)}]
    before = health(batch_worker)["prefill_tokens"]
    reply = client(batch_worker).chat.completions.create(
        model=MODEL,
        messages=messages,  # type: ignore[arg-type]
        max_tokens=4,
        temperature=0,
        n=2,
    )
    texts = {c.index: c.message.content or "" for c in reply.choices}
    assert sorted(texts) == [0, 1] and texts[0] == texts[1] and texts[0]
    usage = reply.usage
    assert usage is not None and usage.completion_tokens == 8
    # The first choice's (the one that prefilled): an earlier test may have left a prefix.
    details = usage.prompt_tokens_details
    rest = usage.prompt_tokens - ((details.cached_tokens or 0) if details else 0)
    prefilled = health(batch_worker)["prefill_tokens"] - before
    assert rest <= prefilled < rest + 8  # the prompt once, not twice


def test_n_streamed_choices_decode_as_rows_of_one_batch(batch_worker: WorkerProcess) -> None:
    """The second choice joins the batch once the first is prefilled, not once it has ended:
    its text streams while the first one's still does."""
    events: list[tuple[int, str]] = []  # (choice, "text" | "finish") in the stream's order
    usage = None
    for chunk in client(batch_worker).chat.completions.create(
        model=MODEL,
        messages=[{"role": "user", "content": "Tell me a story."}],
        max_tokens=16,
        temperature=0,
        n=2,
        stream=True,
        stream_options={"include_usage": True},
        extra_body={"logit_bias": NO_EOS},
    ):
        for choice in chunk.choices:
            if choice.delta.content:
                events.append((choice.index, "text"))
            if choice.finish_reason:
                events.append((choice.index, "finish"))
        usage = chunk.usage or usage
    assert usage is not None and usage.completion_tokens == 32
    assert events.index((1, "text")) < events.index((0, "finish"))
    assert events.count((0, "finish")) == events.count((1, "finish")) == 1
