"""router.kernel.worker_contract: the ready line, the flags and the command line, defined once."""

import argparse
import sys
from pathlib import Path

import pytest

from router.kernel.worker_contract import (
    LANE_MODES,
    MAX_DRAFT_TOKENS,
    READY_PREFIX,
    add_worker_flags,
    check_worker_flags,
    lane_prefix,
    parse_ready_line,
    ready_line,
    worker_argv,
)

# --- ready line ----------------------------------------------------------------------------


def test_ready_line_gives_the_port():
    line = READY_PREFIX + '{"port": 40123, "mode": "speculative", "model": "m"}'
    assert parse_ready_line(line) == 40123


@pytest.mark.parametrize(
    "line",
    [
        "",
        "SPECLANE_WORKER_READY",
        "some log line with port 40123",
        'speclane_worker_ready {"port": 1}',
        READY_PREFIX + "not json",
        READY_PREFIX + "[40123]",
        READY_PREFIX + '{"mode": "batching"}',
        READY_PREFIX + '{"port": "40123"}',
        READY_PREFIX + '{"port": true}',
        READY_PREFIX + '{"port": 0}',
        READY_PREFIX + '{"port": 70000}',
    ],
)
def test_anything_else_is_not_a_ready_line(line):
    assert parse_ready_line(line) is None


def test_the_ready_line_written_is_the_ready_line_read() -> None:
    assert parse_ready_line(ready_line(40123, mode="batching", model="m")) == 40123


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser()
    add_worker_flags(p)
    return p


def test_the_command_line_built_is_the_command_line_parsed() -> None:
    argv = worker_argv(
        sys.executable,
        "speculative",
        Path("/m"),
        "name",
        draft=Path("/d"),
        num_draft_tokens=4,
        max_batch_size=2,
        parent_pid=7,
    )
    assert argv[1:3] == ["-m", "router.worker"]
    args = _parser().parse_args(argv[3:])
    assert (args.mode, args.model, args.model_name, args.draft_model) == (
        "speculative",
        "/m",
        "name",
        "/d",
    )
    assert (args.num_draft_tokens, args.max_batch_size, args.port, args.parent_pid) == (4, 2, 0, 7)


def test_the_batching_lane_gets_no_draft() -> None:
    argv = worker_argv(
        sys.executable,
        "batching",
        Path("/m"),
        "n",
        draft=Path("/d"),
        num_draft_tokens=3,
        max_batch_size=8,
        parent_pid=1,
    )
    assert "--draft-model" not in argv


def test_the_shared_worker_gets_the_draft_and_both_lanes_flags() -> None:
    argv = worker_argv(
        sys.executable,
        "shared",
        Path("/m"),
        "n",
        draft=Path("/d"),
        num_draft_tokens=3,
        max_batch_size=8,
        parent_pid=1,
        prefill_chunk_seconds=0.25,
        speculative=("--draft-source", "draft_model"),
        shared_threads="1",
    )
    p = _parser()
    args = p.parse_args(argv[3:])
    check_worker_flags(p, args)
    assert (args.mode, args.draft_model, args.draft_source) == ("shared", "/d", "draft_model")
    assert (args.max_batch_size, args.prefill_chunk_seconds) == (8, 0.25)
    assert args.shared_threads == "1"
    assert p.parse_args(["--mode", "shared", "--model", "m"]).shared_threads == "auto"


def test_each_lane_of_a_shared_worker_has_its_own_prefix() -> None:
    assert [lane_prefix(lane) for lane in LANE_MODES] == ["/lanes/speculative", "/lanes/batching"]
    with pytest.raises(ValueError):
        lane_prefix("shared")


@pytest.mark.parametrize("value", [-1, MAX_DRAFT_TOKENS + 1])
def test_draft_tokens_out_of_bounds_are_refused(value: int) -> None:
    p = _parser()
    args = p.parse_args(["--mode", "speculative", "--model", "m", "--num-draft-tokens", str(value)])
    with pytest.raises(SystemExit):
        check_worker_flags(p, args)


@pytest.mark.parametrize(("value", "parsed"), [("auto", None), ("0", 0.0), ("0.15", 0.15)])
def test_draft_position_cost_is_auto_or_a_figure(value: str, parsed: float | None) -> None:
    args = _parser().parse_args(
        ["--mode", "batching", "--model", "m", "--draft-position-cost", value]
    )
    assert args.draft_position_cost == parsed


@pytest.mark.parametrize("value", ["-0.1", "nan", "cheap"])
def test_a_bad_draft_position_cost_is_refused(value: str) -> None:
    flags = ["--mode", "batching", "--model", "m", "--draft-position-cost", value]
    with pytest.raises(SystemExit):
        _parser().parse_args(flags)


def test_the_disk_tier_flags_travel_and_are_bounded(tmp_path: Path) -> None:
    from router.kernel.worker_contract import check_worker_flags, default_prompt_cache_dir

    argv = worker_argv(
        sys.executable,
        "batching",
        Path("/m"),
        "name",
        draft=None,
        num_draft_tokens=0,
        max_batch_size=2,
        parent_pid=7,
        prompt_cache_disk_bytes=1 << 30,
        prompt_cache_dir=tmp_path,
        warm_prompts=3,
    )
    p = _parser()
    args = p.parse_args(argv[3:])
    check_worker_flags(p, args)
    assert (args.prompt_cache_disk_bytes, args.prompt_cache_dir, args.warm_prompts) == (
        1 << 30,
        tmp_path,
        3,
    )
    by_hand = p.parse_args(["--mode", "batching", "--model", "m"])
    check_worker_flags(p, by_hand)
    assert (by_hand.prompt_cache_disk_bytes, by_hand.warm_prompts) == (0, 0)  # no disk tier
    assert by_hand.prompt_cache_dir == default_prompt_cache_dir()
    env = {"XDG_CACHE_HOME": str(tmp_path)}
    assert default_prompt_cache_dir(env) == tmp_path / "speclane" / "prompt-cache"
    for bad in (["--prompt-cache-disk-bytes", "-1"], ["--warm-prompts", "65"]):
        with pytest.raises(SystemExit):
            check_worker_flags(p, p.parse_args(["--mode", "batching", "--model", "m", *bad]))
