"""A group's lane: its command line under mlx.launch, free ring ports at every spawn, the
speculative lane alone, and the group of an on-demand model carried to its start."""

from __future__ import annotations

import socket
import sys
from pathlib import Path

from router.config.group import GroupSpec
from router.config.settings import LanesSettings, ModelEntry
from router.lanes.catalog import from_entry
from router.lanes.group import enabled_lanes
from router.lanes.process import build_worker_command
from router.lanes.rankgroup import PORT_PLACEHOLDER, free_port_range, host_memory, with_free_ports

LOCAL = GroupSpec(hosts=("127.0.0.1", "127.0.0.1", "127.0.0.1"))


def command_of(group: GroupSpec) -> tuple[str, ...]:
    lanes = LanesSettings(env={"MLX_X": "1"})
    return build_worker_command(
        "speculative", lanes, Path("/m"), None, "m", python=sys.executable, group=group
    ).argv


def test_local_ranks_run_under_mlx_launch_with_the_group_flags() -> None:
    argv = command_of(LOCAL)
    assert argv[1].endswith("mlx.launch")
    split = argv.index("--")
    launch, worker = argv[:split], argv[split + 1 :]
    assert launch[launch.index("--hosts") + 1] == "127.0.0.1,127.0.0.1,127.0.0.1"
    assert launch[launch.index("--starting-port") + 1] == PORT_PLACEHOLDER
    assert "MLX_X=1" in launch and "--python" not in launch
    assert worker[:3] == (sys.executable, "-m", "router.worker")
    assert worker[worker.index("--group-parallel") + 1] == "tensor"
    assert worker[worker.index("--mode") + 1] == "speculative"


def test_remote_ranks_get_the_interpreter_from_the_launcher() -> None:
    argv = command_of(GroupSpec(hosts=("10.0.0.1", "10.0.0.2"), port=40000))
    launch, worker = argv[: argv.index("--")], argv[argv.index("--") + 1 :]
    assert launch[launch.index("--python") + 1] == sys.executable
    assert launch[launch.index("--starting-port") + 1] == "40000"
    assert worker[:2] == ("-m", "router.worker")


def test_every_spawn_takes_a_free_range() -> None:
    base = free_port_range(3)
    argv = with_free_ports(("x", "--starting-port", PORT_PLACEHOLDER), 3)
    assert argv[2].isdigit() and argv[2] != PORT_PLACEHOLDER
    with socket.socket() as s:  # the range it gave was free
        s.bind(("127.0.0.1", base))


def test_a_group_runs_the_speculative_lane_alone() -> None:
    lanes = LanesSettings()
    assert enabled_lanes(lanes) == ["speculative", "batching"]
    assert enabled_lanes(lanes, grouped=True) == ["speculative"]
    off = LanesSettings(speculative={"enabled": False})  # type: ignore[arg-type]
    assert enabled_lanes(off, grouped=True) == []


def test_an_on_demand_model_carries_its_group() -> None:
    entry = ModelEntry(name="big", path="/big", group=GroupSpec(hosts=("10.0.0.1", "10.0.0.2")))
    assert from_entry(entry, 0).group == entry.group


def test_memory_per_host_sums_its_ranks_from_rank_0s_report() -> None:
    hosts = ("10.0.0.1", "10.0.0.1", "10.0.0.2")
    health = {"group": {"rank_memory_bytes": [100, 50, 70]}}
    assert host_memory(hosts, health) == {"10.0.0.1": 150, "10.0.0.2": 70}
    for broken in (None, {}, {"group": {"rank_memory_bytes": [1, 2]}}, {"group": "x"}):
        assert host_memory(hosts, broken) == {}  # type: ignore[arg-type]
    assert host_memory(hosts, {"group": {"rank_memory_bytes": [1, True, "x"]}}) == {"10.0.0.1": 1}


def test_a_split_the_heads_do_not_allow_is_refused_before_launching(tmp_path: Path) -> None:
    import json

    import pytest

    from router.lanes.group import LaneModels, LaneStartupError, check_group_split

    config = {"num_attention_heads": 9, "num_key_value_heads": 3, "intermediate_size": 1536}
    (tmp_path / "config.json").write_text(json.dumps(config))
    two = GroupSpec(hosts=("127.0.0.1", "127.0.0.1"))
    with pytest.raises(LaneStartupError, match=r"lanes\.group: .*num_attention_heads = 9"):
        check_group_split(LaneModels(str(tmp_path), None, "m", two))
    check_group_split(LaneModels(str(tmp_path), None, "m", LOCAL))  # three ways: fine
    pipeline = GroupSpec(hosts=("127.0.0.1", "127.0.0.1"), parallel="pipeline")
    check_group_split(LaneModels(str(tmp_path), None, "m", pipeline))  # layers, not heads
