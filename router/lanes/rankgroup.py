"""A lane over a group of ranks (``[lanes.group]``): its command line under ``mlx.launch``.

speclane never starts ranks itself: ``mlx.launch`` does (locally for ``127.0.0.1``, over ssh
for other hosts), and the supervisor runs that one launcher as the lane's worker process. The
launcher relays every rank's output, so rank 0's ready line is the group's; it ends every
other rank when one fails, and its process group holds every rank on this machine, so
stopping the worker stops them all.

The ring backend listens on one port per rank, counting up from ``--starting-port``. Unless
``[lanes.group] port`` fixes it, every start takes a fresh free range on this machine
(``PORT_PLACEHOLDER`` in the arguments, replaced at spawn): a restart never waits for the
old ranks' sockets, and two groups never collide. The ports are on no command line: the
launcher is ``python -m router.worker.group.launch <directory>``, and mlx.launch's arguments
are in a file of that directory, which only this user may read (``private_launch``; the
local ranks' scripts land there too). A start whose ring could not set up its sockets (a
port taken meanwhile, a stranger's connection: ``ring_setup_failed``) is tried again on
fresh ports by the supervisor.
"""

from __future__ import annotations

import contextlib
import json
import random
import shutil
import socket
import tempfile
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path

from router.config.group import LOCAL_HOSTS, GroupSpec
from router.kernel.grouplaunch import write_private
from router.kernel.worker_contract import GROUP_LAUNCH_FILE, GROUP_LAUNCH_MODULE, RING_SETUP_FAILED

PORT_PLACEHOLDER = "{ring_port}"
PORT_RANGE = (20000, 60000)
PORT_TRIES = 64
# Starts whose ring could not set up its sockets, each on fresh ports, before the start fails.
RING_START_TRIES = 3


class LauncherMissing(Exception):
    pass


def launcher(python: str) -> list[str]:
    """How to run ``mlx.launch``: the script installed beside ``python`` (mlx's own console
    script), run by that interpreter; else the one on PATH."""
    script = Path(python).parent / "mlx.launch"
    if script.is_file():
        return [python, str(script)]
    found = shutil.which("mlx.launch")
    if found is None:
        raise LauncherMissing(
            "mlx.launch is not installed beside the worker's Python; install mlx (pip install mlx)"
        )
    return [found]


def group_argv(
    spec: GroupSpec, worker: Sequence[str], env: Mapping[str, str], python: str
) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """The launcher's command line and mlx.launch's arguments (private: ``private_launch``)
    running ``worker`` (a worker's command line) on every rank of ``spec``, with the group
    flags; ``env``: set on every rank (other hosts do not inherit ours)."""
    launcher(python)  # mlx.launch is installed beside the worker's Python (else: why not)
    args = ["--backend", spec.backend]
    if spec.hostfile is not None:
        args += ["--hostfile", str(spec.hostfile.expanduser())]
    else:
        args += ["--hosts", ",".join(spec.hosts)]
    if spec.backend == "ring":
        args += ["--starting-port", str(spec.port) if spec.port else PORT_PLACEHOLDER]
    if not spec.local:
        args += ["--python", worker[0]]
    for key, value in sorted(env.items()):
        args += ["--env", f"{key}={value}"]
    group_flags = [
        "--group-parallel",
        spec.parallel,
        "--group-backend",
        spec.backend,
        "--group-hosts",
        ",".join(spec.rank_hosts),
    ]
    # Remote ranks are started with --python's interpreter prefixed: drop ours there.
    command = list(worker[1:]) if not spec.local else list(worker)
    return (python, "-m", GROUP_LAUNCH_MODULE), (*args, "--", *command, *group_flags)


def private_launch(args: Sequence[str], ports: int) -> Path:
    """A new directory only this user may enter (0700) holding mlx.launch's arguments
    (``args`` with fresh ports: ``with_free_ports``) in a file only this user may read
    (0600); the launcher's last argument. The caller removes it once the launcher exits."""
    directory = Path(tempfile.mkdtemp(prefix="speclane-group-"))  # mode 0700
    try:
        write_private(directory / GROUP_LAUNCH_FILE, json.dumps(with_free_ports(args, ports)))
    except BaseException:
        shutil.rmtree(directory, ignore_errors=True)
        raise
    return directory


def ring_setup_failed(stderr_tail: Iterable[str]) -> bool:
    """Whether a rank said its ring could not bind or connect its sockets (then fresh ports
    may well do: a port taken since it was found free, a stranger's connection)."""
    return any(RING_SETUP_FAILED in line for line in stderr_tail)


def host_memory(hosts: Sequence[str], health: Mapping[str, object] | None) -> dict[str, int]:
    """Each host's memory, summed over its ranks, from rank 0's ``/health`` ``group`` block
    (every rank's resident bytes, by rank); empty until reported."""
    group = (health or {}).get("group")
    memory = group.get("rank_memory_bytes") if isinstance(group, dict) else None
    if not isinstance(memory, list) or len(memory) != len(hosts):
        return {}
    out: dict[str, int] = {}
    for host, value in zip(hosts, memory, strict=True):
        if isinstance(value, int) and not isinstance(value, bool):
            out[host] = out.get(host, 0) + value
    return out


def local_ranks(spec: GroupSpec) -> int:
    return sum(1 for host in spec.rank_hosts if host in LOCAL_HOSTS)


def with_free_ports(argv: Sequence[str], count: int) -> tuple[str, ...]:
    """``argv`` with ``PORT_PLACEHOLDER`` replaced by the first of ``count`` consecutive
    ports free on this machine."""
    if PORT_PLACEHOLDER not in argv:
        return tuple(argv)
    base = free_port_range(count)
    return tuple(str(base) if a == PORT_PLACEHOLDER else a for a in argv)


def free_port_range(count: int) -> int:
    rng = random.Random()
    for _ in range(PORT_TRIES):
        base = rng.randrange(PORT_RANGE[0], PORT_RANGE[1] - count)
        if all(_free(base + i) for i in range(count)):
            return base
    raise OSError(f"no {count} consecutive free ports found for the group's ring backend")


def _free(port: int) -> bool:
    with contextlib.closing(socket.socket(socket.AF_INET, socket.SOCK_STREAM)) as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True
