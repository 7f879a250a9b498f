"""The disk tier with real workers on the prepared default model: a worker restarted on the
same directory finds a 1k-token conversation cached, and warms its system prompt at start."""

from __future__ import annotations

import json
import urllib.request
from pathlib import Path
from typing import Any

import openai
import pytest

from router.kernel.worker_contract import CACHE_PARTITION_HEADER
from router.lanes.modelprep import DEFAULT_MODEL_NAME
from tests.worker.conftest import WorkerProcess, start_worker, worker_command

pytestmark = pytest.mark.realmodel

# About 630 tokens of system prompt (an agent's instructions and tools, in short rules) and
# a first turn of about 400 (a file the agent read): a 1k-token conversation, several blocks
# of each (kept short: a real-model prefill costs about 7 ms a token here).
SYSTEM = "You are a coding agent working in a repository.\n" + "".join(
    f"Rule {i}: when a file named module_{i}.py changes, run its tests and report the result "
    f"in one line.\n"
    for i in range(22)
)
FILE = "".join(f"def f{i}(x):\n    return x * {i} + {i * i}\n\n" for i in range(20))
PARTITION = {CACHE_PARTITION_HEADER: "client-a"}


def client(worker: WorkerProcess) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{worker.url}/v1", api_key="x", max_retries=0, timeout=300)


def health(worker: WorkerProcess) -> dict[str, Any]:
    with urllib.request.urlopen(f"{worker.url}/health", timeout=10) as r:
        return json.loads(r.read())


def ask(worker: WorkerProcess, messages: list[dict[str, str]]) -> tuple[str, int, int]:
    """The answer, the prompt's tokens and those read from the cache."""
    reply = client(worker).chat.completions.create(
        model=DEFAULT_MODEL_NAME,
        messages=messages,  # type: ignore[arg-type]
        max_tokens=2,
        temperature=0,
        extra_headers=PARTITION,
    )
    usage = reply.usage
    assert usage is not None and usage.prompt_tokens_details is not None
    cached = usage.prompt_tokens_details.cached_tokens or 0
    return reply.choices[0].message.content or "", usage.prompt_tokens, cached


@pytest.mark.parametrize("mode", ["batching", "speculative"])
def test_a_restarted_worker_finds_the_conversation_on_disk(
    prepared_models: tuple[Path, Path], tmp_path: Path, mode: str
) -> None:
    model, _ = prepared_models
    flags = (
        "--prompt-cache-disk-bytes",
        str(1 << 30),
        "--prompt-cache-dir",
        str(tmp_path / "kv"),
        "--warm-prompts",
        "2",
    )
    first = [
        {"role": "system", "content": SYSTEM},
        {"role": "user", "content": f"module_7.py:\n{FILE}\nWhich rule covers it?"},
    ]
    worker = start_worker(worker_command(model, mode, *flags))
    try:
        answer, prompt, cached = ask(worker, first)
        assert prompt >= 1000 and cached == 0
    finally:
        assert worker.stop() == 0  # SIGTERM: the writer finishes what is queued
    files = sorted(p.name for p in (tmp_path / "kv").iterdir() if p.suffix == ".safetensors")
    # blocks of at most 256 positions, cut at the system prompt's end: 634 + 407 tokens in 5
    assert 4 <= len(files) <= 6

    worker = start_worker(worker_command(model, mode, *flags))
    try:
        warmed = health(worker)["prompt_cache"]
        assert warmed["system_entries"] == 1 and warmed["disk"]["hits"] == 1
        turn = [
            *first,
            {"role": "assistant", "content": answer},
            {"role": "user", "content": "And module_8.py?"},
        ]
        _, prompt, cached = ask(worker, turn)
        system_tokens = warmed["disk"]["loaded_tokens"]
        assert system_tokens < 0.8 * prompt <= cached  # far more than its system prompt
        disk = health(worker)["prompt_cache"]["disk"]
        assert disk["hits"] == 2 and disk["refused"] == 0
        # A new conversation of the same client starts from its system prompt.
        _, prompt, cached = ask(worker, [first[0], {"role": "user", "content": "Hello."}])
        assert prompt - 30 <= cached < prompt
    finally:
        worker.stop()
