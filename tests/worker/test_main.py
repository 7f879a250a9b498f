from __future__ import annotations

import asyncio
import os
import subprocess
import sys
from pathlib import Path

import pytest

from router.kernel.errors import LoadError
from router.worker.main import model_dir, parent_alive, parse_args, watch_parent


def dead_pid() -> int:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


def test_parent_alive() -> None:
    assert parent_alive(os.getppid(), os.getppid())
    assert not parent_alive(dead_pid(), os.getppid())
    assert not parent_alive(os.getppid(), os.getppid() + 1)  # we were re-parented


async def test_watching_a_dead_parent_requests_a_stop() -> None:
    stop = asyncio.Event()
    await asyncio.wait_for(watch_parent(dead_pid(), os.getppid(), stop), 5)
    assert stop.is_set()


async def test_watching_ends_quietly_when_stopping_for_another_reason() -> None:
    stop = asyncio.Event()
    stop.set()
    await asyncio.wait_for(watch_parent(os.getppid(), os.getppid(), stop), 5)


def test_model_dir_must_be_local(tmp_path: Path) -> None:
    with pytest.raises(LoadError, match=r"no config\.json"):
        model_dir(tmp_path)
    (tmp_path / "config.json").write_text("{}")
    assert model_dir(tmp_path) == tmp_path


@pytest.mark.parametrize(
    "argv",
    [
        [],
        ["--mode", "fast", "--model", "m"],
        ["--mode", "batching", "--model", "m", "--max-batch-size", "0"],
        ["--mode", "speculative", "--model", "m", "--num-draft-tokens", "17"],
        ["--mode", "batching", "--model", "m", "--prompt-cache-bytes", "-1"],
        ["--mode", "batching", "--model", "m", "--prefill-step-size", "0"],
        ["--mode", "batching", "--model", "m", "--prefill-chunk-seconds", "0"],
        ["--mode", "speculative", "--model", "m", "--draft-source", "draft_model"],  # no draft
        ["--mode", "speculative", "--model", "m", "--draft-source", "magic"],
        [
            "--mode",
            "speculative",
            "--model",
            "m",
            "--lookup-ngram-min",
            "5",
            "--lookup-ngram-max",
            "3",
        ],
        ["--mode", "speculative", "--model", "m", "--lookup-max-draft", "0"],
    ],
)
def test_bad_command_lines_are_refused(argv: list[str]) -> None:
    with pytest.raises(SystemExit) as info:
        parse_args(argv)
    assert info.value.code == 2


def test_defaults() -> None:
    args = parse_args(["--mode", "speculative", "--model", "m"])
    assert (args.num_draft_tokens, args.max_batch_size, args.host, args.port) == (
        3,
        8,
        "127.0.0.1",
        0,
    )
    assert args.parent_pid is None and args.draft_model is None
    assert (args.prompt_cache_bytes, args.prefill_step_size, args.prefill_chunk_seconds) == (
        1 << 30,
        2048,
        0.5,
    )
    assert args.draft_source == "none"  # no draft model: no lane-wide drafting
    with_draft = parse_args(["--mode", "speculative", "--model", "m", "--draft-model", "d"])
    assert with_draft.draft_source == "draft_model"
    assert (args.lookup_ngram_min, args.lookup_ngram_max, args.lookup_max_draft) == (2, 4, 8)
    assert args.prediction_max_draft == 16
