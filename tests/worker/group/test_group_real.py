"""Two real ranks on 127.0.0.1 (``mlx.launch --backend ring``) serving a tiny random llama
split by tensor parallelism, against one worker process on the same model: greedy answers
are token for token the same, plain and with every draft source (a draft model on rank 0
alone included), from the prompt cache too; a killed rank ends the whole group; SIGTERM
leaves no rank."""

from __future__ import annotations

import signal
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psutil
import pytest

from tests.worker.conftest import WorkerProcess, start_worker, worker_command
from tests.worker.group.conftest import Group, health, post, start_group

pytestmark = pytest.mark.realmodel

COPY = (
    "def area(width, height):\n    return width * height\n\n"
    "def area(width, height):\n    return width * height\n\n"
    "def area("
)


@pytest.fixture(scope="module")
def pair(tiny_model: Path, tiny_draft: Path) -> Iterator[tuple[Group, WorkerProcess]]:
    """The group and one process, same model, same draft, same flags."""
    flags = ("--model", str(tiny_model), "--draft-model", str(tiny_draft), "--draft-source", "auto")
    group = start_group(2, *flags)
    try:
        single = start_worker(worker_command(tiny_model, "speculative", *flags[2:]))
    except BaseException:
        group.stop()
        raise
    yield group, single
    group.stop()
    single.stop()


def completion(url: str, prompt: str, **extra: Any) -> tuple[str, dict[str, Any]]:
    body = {"prompt": prompt, "max_tokens": 24, "temperature": 0, **extra}
    answer = post(url, body)
    return answer["choices"][0]["text"], answer["usage"]


@pytest.mark.parametrize(
    "source",
    [
        {"num_draft_tokens": 0},
        {"draft_source": "prompt_lookup"},
        {"draft_source": "suffix"},
        {"draft_source": "draft_model"},
        {"draft_source": "auto"},
        {"prediction": {"type": "content", "content": "return width * height\n"}},
    ],
    ids=["plain", "prompt_lookup", "suffix", "draft_model", "auto", "prediction"],
)
def test_greedy_answers_equal_one_process(
    pair: tuple[Group, WorkerProcess], source: dict[str, Any]
) -> None:
    group, single = pair
    text, usage = completion(group.url, COPY, **source)
    expected, expected_usage = completion(single.url, COPY, **source)
    assert text == expected
    assert usage["completion_tokens"] == expected_usage["completion_tokens"] == 24
    spec = usage["speclane_spec"]
    if "num_draft_tokens" in source:
        assert spec["drafted"] == 0
    elif source.get("draft_source") in ("prompt_lookup", "draft_model"):
        assert spec["drafted"] > 0, spec  # the draft reached every rank, verified in one pass


def test_the_prompt_cache_resumes_on_every_rank(pair: tuple[Group, WorkerProcess]) -> None:
    group, single = pair
    first = "The tiny model counts: one two three four five six seven"
    completion(group.url, first, max_tokens=4, num_draft_tokens=0)
    text, usage = completion(group.url, first + " eight nine", draft_source="prompt_lookup")
    expected, _ = completion(single.url, first + " eight nine", draft_source="prompt_lookup")
    assert usage["prompt_tokens_details"]["cached_tokens"] > 5
    assert text == expected


def test_a_streamed_chat_equals_one_process(pair: tuple[Group, WorkerProcess]) -> None:
    group, single = pair
    body = {
        "messages": [{"role": "user", "content": COPY}],
        "max_tokens": 16,
        "temperature": 0,
    }
    answers = [post(u, body, "/v1/chat/completions") for u in (group.url, single.url)]
    texts = [a["choices"][0]["message"]["content"] for a in answers]
    assert texts[0] == texts[1]


def test_pipeline_parallel_answers_equal_one_process(tiny_pipeline_model: Path) -> None:
    """Each rank holds half the layers (mlx-lm's pipeline()); the last all_gather gives every
    rank the output, so rank 0 samples as alone."""
    flags = ("--draft-source", "prompt_lookup")
    single = start_worker(worker_command(tiny_pipeline_model, "speculative", *flags))
    try:
        expected = [completion(single.url, COPY, **b)[0] for b in ({"num_draft_tokens": 0}, {})]
    finally:
        single.stop()
    group = start_group(2, "--model", str(tiny_pipeline_model), *flags, parallel="pipeline")
    try:
        assert health(group.url)["group"]["parallel"] == "pipeline"
        plain, _ = completion(group.url, COPY, num_draft_tokens=0)
        drafted, usage = completion(group.url, COPY)
    finally:
        group.stop()
    assert [plain, drafted] == expected
    assert usage["speclane_spec"]["drafted"] > 0


def test_health_reports_the_group(pair: tuple[Group, WorkerProcess]) -> None:
    group, _ = pair
    reported = health(group.url)["group"]
    assert reported["ranks"] == 2 and reported["hosts"] == ["127.0.0.1", "127.0.0.1"]
    assert (reported["backend"], reported["parallel"]) == ("ring", "tensor")
    assert len(reported["rank_memory_bytes"]) == 2
    assert all(m > 50 << 20 for m in reported["rank_memory_bytes"])


def test_a_killed_rank_ends_the_whole_group(tiny_model: Path) -> None:
    group = start_group(2, "--model", str(tiny_model), "--draft-source", "prompt_lookup")
    try:
        ranks = group.ranks()
        assert len(ranks) == 2
        leader = health(group.url)["pid"]  # rank 0 serves HTTP
        follower = next(p for p in ranks if p.pid != leader)
        survivors = [p for p in ranks if p.pid != follower.pid]
        follower.send_signal(signal.SIGKILL)
        group.proc.wait(60)  # mlx.launch ends the others and itself
        _, alive = psutil.wait_procs(survivors, timeout=30)
        assert not alive, f"ranks left behind: {[p.pid for p in alive]}"
    finally:
        group.stop()


def test_sigterm_leaves_no_rank(pair: tuple[Group, WorkerProcess]) -> None:
    """The last test on the module's group: it stops it (the fixture's stop is then a no-op),
    which saves starting a group of its own."""
    group, _ = pair
    members = [psutil.Process(group.proc.pid), *group.ranks()]
    assert len(members) == 3
    group.stop()
    _, alive = psutil.wait_procs(members, timeout=5)
    assert not alive
