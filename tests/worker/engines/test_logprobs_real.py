"""Log-probabilities from the real lane workers on the default model (few tokens): OpenAI's
shapes through the openai SDK, the entries' texts joining to the answer, and the target's own
distribution whether a position was drafted or not, on both lanes."""

from __future__ import annotations

import openai
import pytest

from router.lanes.modelprep import DEFAULT_MODEL_NAME
from tests.worker.conftest import WorkerProcess

pytestmark = pytest.mark.realmodel

REPEAT = [
    {
        "role": "user",
        "content": "Repeat exactly: the quick brown fox jumps over the lazy dog, "
        "the quick brown fox jumps over the lazy dog",
    }
]
# Logits of one position through a pass one or several positions wide differ in the last
# bits (bfloat16 matmuls): the same distribution, not the same floats.
CLOSE = 0.1


def client(worker: WorkerProcess) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{worker.url}/v1", api_key="x", max_retries=0, timeout=120)


def chat(worker: WorkerProcess, **extra: object) -> openai.types.chat.ChatCompletion:
    return client(worker).chat.completions.create(
        model=DEFAULT_MODEL_NAME,
        messages=REPEAT,  # type: ignore[arg-type]
        max_tokens=10,
        temperature=0,
        logprobs=True,
        top_logprobs=3,
        **extra,  # type: ignore[arg-type]
    )


def entries(reply: openai.types.chat.ChatCompletion) -> list:
    logprobs = reply.choices[0].logprobs
    assert logprobs is not None and logprobs.content is not None
    return logprobs.content


def test_drafted_positions_report_the_targets_distribution(
    spec_worker: WorkerProcess, batch_worker: WorkerProcess
) -> None:
    plain = chat(spec_worker, extra_body={"num_draft_tokens": 0})
    drafted = chat(spec_worker, extra_body={"draft_source": "prompt_lookup"})
    batched = chat(batch_worker)
    assert drafted.usage is not None
    assert drafted.usage.model_extra["speclane_spec"]["accepted"] > 0  # some positions drafted
    for reply in (plain, drafted, batched):
        content = reply.choices[0].message.content
        got = entries(reply)
        assert "".join(e.token for e in got) == content
        for e in got:
            assert e.logprob <= 0 and e.bytes == list(e.token.encode())
            assert len(e.top_logprobs) == 3
            # Greedy: the emitted token is the most likely one.
            assert e.top_logprobs[0].logprob == pytest.approx(e.logprob, abs=1e-5)
    base = entries(plain)
    for reply in (drafted, batched):
        assert reply.choices[0].message.content == plain.choices[0].message.content
        assert [e.logprob for e in entries(reply)] == pytest.approx(
            [e.logprob for e in base], abs=CLOSE
        )


@pytest.mark.parametrize("lane", ["speculative", "batching"])
def test_streams_and_completions_carry_them_too(
    lane: str, spec_worker: WorkerProcess, batch_worker: WorkerProcess
) -> None:
    worker = spec_worker if lane == "speculative" else batch_worker
    stream = client(worker).chat.completions.create(
        model=DEFAULT_MODEL_NAME,
        messages=REPEAT,  # type: ignore[arg-type]
        max_tokens=6,
        temperature=0,
        logprobs=True,
        stream=True,
    )
    text, joined = "", ""
    for chunk in stream:
        choice = chunk.choices[0]
        text += choice.delta.content or ""
        if choice.logprobs is not None:
            joined += "".join(e.token for e in choice.logprobs.content or [])
    assert text and joined == text
    done = client(worker).completions.create(
        model=DEFAULT_MODEL_NAME, prompt="The capital of France is", max_tokens=4, logprobs=2
    )
    logprobs = done.choices[0].logprobs
    assert logprobs is not None and logprobs.tokens is not None
    assert "".join(logprobs.tokens) == done.choices[0].text
    assert logprobs.text_offset == [
        sum(len(t) for t in logprobs.tokens[:i]) for i in range(len(logprobs.tokens))
    ]
    assert all(len(top) <= 2 for top in logprobs.top_logprobs or [])
