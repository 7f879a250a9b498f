"""A lane over a group of ranks (``[lanes.group]``): its command line under ``mlx.launch``.

speclane never starts ranks itself: ``mlx.launch`` does (locally for ``127.0.0.1``, over ssh
for other hosts), and the supervisor runs that one launcher as the lane's worker process. The
launcher relays every rank's output, so rank 0's ready line is the group's; it ends every
other rank when one fails, and its process group holds every rank on this machine, so
stopping the worker stops them all.

The ring backend listens on one port per rank, counting up from ``--starting-port``. Unless
``[lanes.group] port`` fixes it, every start takes a fresh free range on this machine
(``PORT_PLACEHOLDER`` in the command line, replaced at spawn): a restart never waits for the
old ranks' sockets, and two groups never collide.
"""

from __future__ import annotations

import contextlib
import random
import shutil
import socket
from collections.abc import Mapping, Sequence
from pathlib import Path

from router.config.group import LOCAL_HOSTS, GroupSpec

PORT_PLACEHOLDER = "{ring_port}"
PORT_RANGE = (20000, 60000)
PORT_TRIES = 64


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
) -> tuple[str, ...]:
    """``mlx.launch`` running ``worker`` (a worker's command line) on every rank of ``spec``,
    with the group flags; ``env``: set on every rank (other hosts do not inherit ours)."""
    argv = [*launcher(python), "--backend", spec.backend]
    if spec.hostfile is not None:
        argv += ["--hostfile", str(spec.hostfile.expanduser())]
    else:
        argv += ["--hosts", ",".join(spec.hosts)]
    if spec.backend == "ring":
        argv += ["--starting-port", str(spec.port) if spec.port else PORT_PLACEHOLDER]
    if not spec.local:
        argv += ["--python", worker[0]]
    for key, value in sorted(env.items()):
        argv += ["--env", f"{key}={value}"]
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
    return (*argv, "--", *command, *group_flags)


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
