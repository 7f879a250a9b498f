"""A group's lanes: its command line under mlx.launch, free ring ports at every spawn, both
lanes in the one shared process, and the group of an on-demand model carried to its start."""

from __future__ import annotations

import socket
import sys
from pathlib import Path

import pytest

from router.config.group import GroupSpec
from router.config.settings import LanesSettings, ModelEntry
from router.lanes.catalog import from_entry
from router.lanes.group import enabled_lanes
from router.lanes.process import build_worker_command
from router.lanes.rankgroup import PORT_PLACEHOLDER, free_port_range, host_memory, with_free_ports
from router.worker_contract import SHARED_MODE

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


def test_a_group_serves_both_lanes_from_one_shared_process() -> None:
    from router.lanes.group import LaneModels, layout_choice

    lanes = LanesSettings(layout="separate")
    assert enabled_lanes(lanes) == ["speculative", "batching"]
    grouped = LaneModels("/m", None, "m", LOCAL)
    choice = layout_choice(lanes, grouped)
    assert choice.layout == "shared" and "group" in choice.reason
    assert layout_choice(lanes, LaneModels("/m", None, "m")).layout == "separate"
    spec_only = LanesSettings(batching={"enabled": False})  # type: ignore[arg-type]
    assert layout_choice(spec_only, grouped).layout == "separate"  # one lane, one process
    argv = build_worker_command(
        SHARED_MODE, lanes, Path("/m"), None, "m", python=sys.executable, group=LOCAL
    ).argv
    worker = argv[argv.index("--") + 1 :]
    assert worker[worker.index("--mode") + 1] == SHARED_MODE
    assert worker[worker.index("--group-parallel") + 1] == "tensor"
    with pytest.raises(ValueError, match="speculative lane or both"):
        build_worker_command("batching", lanes, Path("/m"), None, "m", group=LOCAL)


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
