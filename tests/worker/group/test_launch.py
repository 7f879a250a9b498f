"""A group's launcher (``router.worker.group.launch``): mlx.launch's arguments from a private
file, each local rank's script in a private file it sources; what ``ps`` shows holds no
port. The scripts are mlx.launch's own (its ``make_launch_script``); one test runs two real
ranks of the ring backend through the launcher."""

from __future__ import annotations

import inspect
import json
import shutil
import stat
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest

from router.kernel.worker_contract import GROUP_LAUNCH_FILE, GROUP_LAUNCH_MODULE
from router.lanes.rankgroup import free_port_range, private_launch
from router.worker.group.launch import private_scripts, read_arguments


@pytest.fixture
def private_dir() -> Iterator[Path]:
    directory = private_launch(["--backend", "ring"], 0)
    yield directory
    shutil.rmtree(directory)


def test_mlx_launch_builds_a_ranks_script_as_the_wrapper_expects() -> None:
    from mlx._distributed_utils.launch import RemoteProcess

    params = list(inspect.signature(RemoteProcess.make_launch_script).parameters)
    assert params == ["rank", "python", "cwd", "files", "env", "command", "is_local"]


def test_a_local_ranks_script_is_a_private_file_it_sources(private_dir: Path) -> None:
    from mlx._distributed_utils.launch import RemoteProcess

    hostfile = json.dumps([["127.0.0.1:40123"], ["127.0.0.1:40124"]])
    make = private_scripts(RemoteProcess.make_launch_script, private_dir)
    env, command = ["MLX_X=1"], ["python", "-m", "router.worker"]
    local = make(1, None, None, {"MLX_HOSTFILE": hostfile}, env, command, True)
    path = private_dir / "rank-1.sh"
    assert local == f". {path}"  # bash -c's whole command line: no port, no hostfile
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    script = path.read_text()
    assert "40123" in script and "export MLX_RANK=1" in script and "exec " in script
    # A rank on another host: mlx.launch's own script, for ssh (it has no other way)
    remote = make(0, None, None, {"MLX_HOSTFILE": hostfile}, env, command, False)
    original = RemoteProcess.make_launch_script(
        0, None, None, {"MLX_HOSTFILE": hostfile}, env, command, False
    )
    assert remote == original and not (private_dir / "rank-0.sh").exists()


def test_the_arguments_are_read_from_the_private_file(private_dir: Path) -> None:
    assert read_arguments(private_dir) == ["--backend", "ring"]
    (private_dir / GROUP_LAUNCH_FILE).unlink()
    (private_dir / GROUP_LAUNCH_FILE).write_text('{"not": "a list"}')
    with pytest.raises(ValueError, match="not a JSON array of strings"):
        read_arguments(private_dir)


RANK = textwrap.dedent(
    """
    import json, os, stat
    import mlx.core as mx
    import psutil

    group = mx.distributed.init(strict=True, backend="ring")
    total = mx.distributed.all_sum(mx.array([1.0]), group=group)
    me = psutil.Process()
    print(json.dumps({
        "rank": group.rank(),
        "sum": total.item(),
        "cmdlines": [me.cmdline(), me.parent().cmdline()],
        "hostfile_mode": stat.S_IMODE(os.stat(os.environ["MLX_HOSTFILE"]).st_mode),
    }), flush=True)
    """
)


@pytest.mark.realmodel  # real MLX processes (no model): the ring backend over loopback
def test_two_real_ranks_start_through_the_launcher_and_no_command_line_holds_a_port(
    tmp_path: Path,
) -> None:
    rank = tmp_path / "rank.py"
    rank.write_text(RANK)
    port = free_port_range(2)
    args = ["--backend", "ring", "--hosts", "127.0.0.1,127.0.0.1"]
    args += ["--starting-port", str(port), "--", sys.executable, str(rank)]
    directory = private_launch(args, 0)
    try:
        done = subprocess.run(
            [sys.executable, "-m", GROUP_LAUNCH_MODULE, str(directory)],
            capture_output=True,
            text=True,
            timeout=120,
        )
    finally:
        shutil.rmtree(directory)
    lines = [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]
    assert sorted(r["rank"] for r in lines) == [0, 1], done.stderr
    for r in lines:
        assert r["sum"] == 2.0 and r["hostfile_mode"] == 0o600
        # the rank's own command line, and its launcher's (its parent: the script exec'd)
        assert r["cmdlines"][0] == [sys.executable, str(rank)]
        assert r["cmdlines"][1] == [sys.executable, "-m", GROUP_LAUNCH_MODULE, str(directory)]
        assert not any(str(port) in arg or str(port + 1) in arg for c in r["cmdlines"] for arg in c)
