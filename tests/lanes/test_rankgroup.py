"""A group's lanes: its command line under mlx.launch, free ring ports at every spawn, both
lanes in the one shared process, and the group of an on-demand model carried to its start."""

from __future__ import annotations

import json
import shutil
import socket
import stat
import sys
from pathlib import Path

import pytest

from router.config.group import GroupSpec
from router.config.settings import LanesSettings, ModelEntry
from router.kernel.worker_contract import GROUP_LAUNCH_FILE, GROUP_LAUNCH_MODULE, SHARED_MODE
from router.lanes.catalog import from_entry
from router.lanes.group import enabled_lanes
from router.lanes.process import WorkerCommand, build_worker_command
from router.lanes.rankgroup import (
    PORT_PLACEHOLDER,
    free_port_range,
    host_memory,
    private_launch,
    ring_setup_failed,
    with_free_ports,
)

LOCAL = GroupSpec(hosts=("127.0.0.1", "127.0.0.1", "127.0.0.1"))


def command_of(group: GroupSpec) -> WorkerCommand:
    lanes = LanesSettings(env={"MLX_X": "1"})
    return build_worker_command(
        "speculative", lanes, Path("/m"), None, "m", python=sys.executable, group=group
    )


def test_local_ranks_run_under_mlx_launch_with_the_group_flags() -> None:
    command = command_of(LOCAL)
    assert command.argv == (sys.executable, "-m", GROUP_LAUNCH_MODULE)
    args = command.launch_args
    split = args.index("--")
    launch, worker = args[:split], args[split + 1 :]
    assert launch[launch.index("--hosts") + 1] == "127.0.0.1,127.0.0.1,127.0.0.1"
    assert launch[launch.index("--starting-port") + 1] == PORT_PLACEHOLDER
    assert "MLX_X=1" in launch and "--python" not in launch
    assert worker[:3] == (sys.executable, "-m", "router.worker")
    assert worker[worker.index("--group-parallel") + 1] == "tensor"
    assert worker[worker.index("--mode") + 1] == "speculative"
    assert command.ring_ports == 3 and command.fresh_ports


def test_remote_ranks_get_the_interpreter_from_the_launcher() -> None:
    command = command_of(GroupSpec(hosts=("10.0.0.1", "10.0.0.2"), port=40000))
    args = command.launch_args
    launch, worker = args[: args.index("--")], args[args.index("--") + 1 :]
    assert launch[launch.index("--python") + 1] == sys.executable
    assert launch[launch.index("--starting-port") + 1] == "40000"
    assert worker[:2] == ("-m", "router.worker")
    assert not command.fresh_ports  # the port is fixed: no fresh range to start again on


def test_every_spawn_takes_a_free_range() -> None:
    base = free_port_range(3)
    argv = with_free_ports(("x", "--starting-port", PORT_PLACEHOLDER), 3)
    assert argv[2].isdigit() and argv[2] != PORT_PLACEHOLDER
    with socket.socket() as s:  # the range it gave was free
        s.bind(("127.0.0.1", base))


def test_the_launchers_arguments_are_private_and_its_command_line_holds_no_port() -> None:
    command = command_of(LOCAL)
    directories = [private_launch(command.launch_args, command.ring_ports) for _ in range(2)]
    try:
        ports = []
        for directory in directories:
            assert stat.S_IMODE(directory.stat().st_mode) == 0o700
            file = directory / GROUP_LAUNCH_FILE
            assert stat.S_IMODE(file.stat().st_mode) == 0o600
            args = json.loads(file.read_text())
            ports.append(int(args[args.index("--starting-port") + 1]))
            assert args[args.index("--starting-port") + 2 :] == list(
                command.launch_args[command.launch_args.index("--starting-port") + 2 :]
            )
        assert ports[0] != ports[1]  # fresh ports at every spawn
        # What ps shows of the launcher: the interpreter, the module, the directory.
        argv = (*command.argv, str(directories[0]))
        assert not any(str(port) in arg for arg in argv for port in ports)
        assert PORT_PLACEHOLDER not in argv and "--starting-port" not in argv
    finally:
        for directory in directories:
            shutil.rmtree(directory)


def test_what_a_rank_said_tells_a_ring_that_could_not_set_up() -> None:
    assert ring_setup_failed(["x", "RuntimeError: [ring] Couldn't bind socket (error: 98)"])
    assert ring_setup_failed(["RuntimeError: [ring] Couldn't connect (error: 111)"])
    assert not ring_setup_failed(["cannot load the model", "[ring] connection to a peer was lost"])


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
    args = build_worker_command(
        SHARED_MODE, lanes, Path("/m"), None, "m", python=sys.executable, group=LOCAL
    ).launch_args
    worker = args[args.index("--") + 1 :]
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
