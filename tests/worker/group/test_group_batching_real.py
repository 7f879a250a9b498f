"""Both lanes over a group (``--mode shared`` under ``mlx.launch``, two real ranks on
127.0.0.1, the tiny llama split by tensor parallelism): the batching lane's greedy answers
are the single-process batching lane's token for token, for two requests decoding in one
batch (plain, drafting by prompt lookup, a forced tool call beside free text), from a prompt
cached on every rank and past a stop string; a seeded draw follows rank 0's; the
speculative lane serves beside it from the same copy of the model."""

from __future__ import annotations

from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

from router.kernel.worker_contract import lane_prefix
from tests.lanes.test_lanes_tools_e2e import ASK, READ
from tests.worker.conftest import WorkerProcess, start_worker, worker_command
from tests.worker.group.conftest import Group, health, post, start_group

pytestmark = pytest.mark.realmodel

FLAGS = ("--max-batch-size", "4")
COPY = (
    "def area(width, height):\n    return width * height\n\n"
    "def area(width, height):\n    return width * height\n\n"
    "def area("
)
COUNT = "one two three four five six seven eight nine ten one two three four five six"
# Prefilled in chunks wider than batchgen.WHOLE_WIDTH once the first has measured the rate:
# those passes are evaluated only as far as their KV caches.
LONG = COPY * 6


@pytest.fixture(scope="module")
def pair(tiny_model: Path) -> Iterator[tuple[Group, WorkerProcess]]:
    """The group serving both lanes, and one batching-lane process on the same model."""
    group = start_group(2, "--model", str(tiny_model), *FLAGS, mode="shared")
    try:
        single = start_worker(worker_command(tiny_model, "batching", *FLAGS))
    except BaseException:
        group.stop()
        raise
    yield group, single
    group.stop()
    single.stop()


def answers(url: str, bodies: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The answers to ``bodies`` sent at once (they join one batch)."""
    with ThreadPoolExecutor(len(bodies)) as pool:
        return list(pool.map(lambda b: post(url, b), bodies))


@pytest.mark.parametrize(
    "source",
    [{"num_draft_tokens": 0}, {"draft_source": "prompt_lookup"}],
    ids=["plain", "prompt_lookup"],
)
def test_two_sequences_in_one_batch_equal_one_process(
    pair: tuple[Group, WorkerProcess], source: dict[str, Any]
) -> None:
    group, single = pair
    bodies = [
        {"prompt": prompt, "max_tokens": 20, "temperature": 0, **source} for prompt in (LONG, COUNT)
    ]
    grouped = answers(group.url + lane_prefix("batching"), bodies)
    alone = answers(single.url, bodies)
    assert [a["choices"][0]["text"] for a in grouped] == [a["choices"][0]["text"] for a in alone]
    assert [a["usage"]["completion_tokens"] for a in grouped] == [20, 20]
    if "draft_source" in source:  # the drafts reached every rank, verified in one pass
        spec = [a["usage"]["speclane_spec"] for a in grouped]
        assert sum(s["drafted"] for s in spec) > 0, spec


def test_a_cached_prompt_resumes_on_every_rank(pair: tuple[Group, WorkerProcess]) -> None:
    group, single = pair
    url = group.url + lane_prefix("batching")
    post(url, {"prompt": COUNT, "max_tokens": 2, "temperature": 0})
    body = {"prompt": COUNT + " seven eight", "max_tokens": 12, "temperature": 0}
    resumed = post(url, body)
    assert resumed["usage"]["prompt_tokens_details"]["cached_tokens"] > 5
    assert resumed["choices"][0]["text"] == post(single.url, body)["choices"][0]["text"]


def test_a_stop_string_takes_the_sequence_out_of_the_batch_on_every_rank(
    pair: tuple[Group, WorkerProcess],
) -> None:
    group, single = pair
    body: dict[str, Any] = {"prompt": COUNT, "max_tokens": 16, "temperature": 0}
    words = post(single.url, body)["choices"][0]["text"].split()
    body["stop"] = [words[len(words) // 2]]  # mid-answer: the row leaves a running batch
    grouped, alone = (
        post(url, body)["choices"][0] for url in (group.url + lane_prefix("batching"), single.url)
    )
    assert (grouped["text"], grouped["finish_reason"]) == (alone["text"], "stop")
    again = post(group.url + lane_prefix("batching"), {**body, "stop": []})  # the group goes on
    assert again["usage"]["completion_tokens"] == 16


def test_the_speculative_lane_serves_beside_it(pair: tuple[Group, WorkerProcess]) -> None:
    """Both lanes at once: their passes interleave in the one op log."""
    group, _ = pair
    body = {"prompt": COPY, "max_tokens": 12, "temperature": 0}
    with ThreadPoolExecutor(2) as pool:
        spec, batch = pool.map(
            lambda lane: post(group.url + lane_prefix(lane), body), ("speculative", "batching")
        )
    assert spec["choices"][0]["text"] == batch["choices"][0]["text"]
    reported = health(group.url)
    assert reported["group"]["ranks"] == 2 and len(reported["group"]["rank_memory_bytes"]) == 2
    assert set(reported["lanes"]) == {"speculative", "batching"}


def test_a_sampled_answer_follows_rank_0s_draws(pair: tuple[Group, WorkerProcess]) -> None:
    """Only rank 0 samples (seeded, as alone): the other rank's cache holds its draws, not
    its own, or rank 0's next logits (summed over both ranks) would differ from one
    process's. A prompt neither has cached: a seeded draw from the tiny model's flat logits
    already differs between one process's cache computed alone and in a batch."""
    group, single = pair
    body = {
        "prompt": "Sampled, never cached. " + COPY,
        "max_tokens": 16,
        "temperature": 1.0,
        "seed": 7,
        "draft_source": "prompt_lookup",
    }
    grouped = post(group.url + lane_prefix("batching"), body)["choices"][0]["text"]
    assert grouped == post(single.url, body)["choices"][0]["text"]


def test_a_forced_tool_call_beside_free_text_equals_one_process(
    pair: tuple[Group, WorkerProcess],
) -> None:
    """A constrained row drafts its grammar's forced tokens (masked on rank 0 alone) in the
    same batch as a free one."""
    group, single = pair
    bodies = [
        {"messages": ASK, "tools": [READ], "tool_choice": "required", "max_tokens": 40},
        {"messages": [{"role": "user", "content": COUNT}], "max_tokens": 12},
    ]
    bodies = [{**b, "temperature": 0} for b in bodies]

    def said(url: str) -> list[Any]:
        with ThreadPoolExecutor(2) as pool:
            done = pool.map(lambda b: post(url, b, "/v1/chat/completions"), bodies)
            messages = [d["choices"][0]["message"] for d in done]
        return [
            [c["function"] for c in m.get("tool_calls") or []] or m["content"] for m in messages
        ]

    grouped = said(group.url + lane_prefix("batching"))
    assert grouped[0] and grouped[0][0]["name"] == "read"
    assert grouped == said(single.url)
