"""CPU time of the benchmarked processes and their pinning to cores (Linux): on a small shared
machine CPU seconds per request say what each process costs whatever the sharing, and a core
of the proxy's own says whether it keeps up when not starved. Without ``/proc`` and
``sched_setaffinity`` (macOS) the figures are left out, never guessed."""

from __future__ import annotations

import contextlib
import os
from pathlib import Path

PROC = Path("/proc")
_TICKS = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


def supported() -> bool:
    return (PROC / "self" / "stat").exists() and hasattr(os, "sched_setaffinity")


def _session_members(sid: int) -> dict[int, list[str]]:
    """pid -> its /proc stat fields after the command name (which may hold spaces)."""
    members = {}
    for entry in PROC.iterdir():
        with contextlib.suppress(OSError):  # a process that ended meanwhile
            if entry.name.isdigit():
                fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
                if int(fields[3]) == sid:  # fields[3]: the session id
                    members[int(entry.name)] = fields
    return members


def session_cpu_seconds(sid: int) -> float | None:
    """User + system CPU seconds of every live process in session ``sid``: a benchmarked
    process leads its own session, so this includes its workers (nginx's, for one)."""
    if not supported():
        return None
    return sum(int(f[11]) + int(f[12]) for f in _session_members(sid).values()) / _TICKS


def session_pids(sid: int) -> list[int]:
    return list(_session_members(sid))


def pin(pids: list[int], cpus: set[int]) -> None:
    """Pin every thread of these processes (affinity is per thread; later ones inherit it)."""
    for pid in pids:
        with contextlib.suppress(FileNotFoundError):
            for task in (PROC / str(pid) / "task").iterdir():
                with contextlib.suppress(ProcessLookupError, FileNotFoundError):
                    os.sched_setaffinity(int(task.name), cpus)


def pin_session(sid: int, cpus: set[int]) -> None:
    pin(session_pids(sid), cpus)


def allowed_cpus() -> set[int]:
    return set(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else set()


def split(cpus: set[int]) -> tuple[set[int], set[int]] | None:
    """(proxy cores, upstream and load generator cores): the proxy gets the last core to
    itself, everything else shares the rest. None with fewer than two cores."""
    ordered = sorted(cpus)
    return ({ordered[-1]}, set(ordered[:-1])) if len(ordered) >= 2 else None
