"""The default model (9 attention heads, 3 KV heads) split three ways over three real ranks
on 127.0.0.1: its greedy answers equal one process's, plain and drafting by prompt lookup.
Three ranks share two busy cores here (about 0.5 tokens per second): a handful of tokens."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.worker.conftest import start_worker, worker_command
from tests.worker.group.conftest import start_group
from tests.worker.group.test_group_real import completion, health

pytestmark = pytest.mark.realmodel

PROMPT = "Repeat exactly: alpha beta gamma delta.\nalpha beta gamma delta.\nalpha beta"


def test_three_ranks_answer_as_one_process(prepared_models: tuple[Path, Path]) -> None:
    model, _ = prepared_models
    flags = ("--draft-source", "prompt_lookup")
    single = start_worker(worker_command(model, "speculative", *flags))
    try:
        expected = {
            name: completion(single.url, PROMPT, max_tokens=6, **body)[0]
            for name, body in (("plain", {"num_draft_tokens": 0}), ("lookup", {}))
        }
    finally:
        single.stop()
    group = start_group(3, "--model", str(model), *flags)
    try:
        assert health(group.url)["group"]["ranks"] == 3
        plain, _ = completion(group.url, PROMPT, max_tokens=6, num_draft_tokens=0)
        drafted, usage = completion(group.url, PROMPT, max_tokens=6)
    finally:
        group.stop()
    assert plain == expected["plain"] == expected["lookup"] == drafted
    assert usage["speclane_spec"]["drafted"] > 0
