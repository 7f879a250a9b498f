"""CPU time of the processes a benchmark measures, and pinning them to cores (Linux).

On a small shared machine throughput ratios mostly say how the cores were shared; CPU
seconds per request say what each process costs, and pinning the proxies to a core of their
own says whether they keep up when not starved. Without ``/proc`` and ``sched_setaffinity``
(macOS) the figures are left out, never guessed."""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Iterator
from pathlib import Path

PROC = Path("/proc")
_TICKS = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


def supported() -> bool:
    return (PROC / "self" / "stat").exists() and hasattr(os, "sched_setaffinity")


def _stat_fields(path: Path) -> list[str] | None:
    try:
        text = path.read_text()
    except OSError:  # the process ended between listing and reading
        return None
    # The command name (field 2) may hold spaces and parentheses: split after its end.
    return text.rsplit(")", 1)[1].split()


def _session_members(sid: int) -> Iterator[tuple[int, list[str]]]:
    for entry in PROC.iterdir():
        if entry.name.isdigit() and (fields := _stat_fields(entry / "stat")) is not None:
            if int(fields[3]) == sid:  # fields[3]: session id
                yield int(entry.name), fields


def session_cpu_seconds(sid: int) -> float | None:
    """User + system CPU seconds of every live process in session ``sid``: a benchmarked
    process leads its own session, so this includes its workers (nginx's, for one)."""
    if not supported():
        return None
    ticks = sum(int(f[11]) + int(f[12]) for _, f in _session_members(sid))
    return ticks / _TICKS


def own_cpu_seconds() -> float:
    """CPU seconds of this process, every thread included (the load generator)."""
    return time.process_time()


def _pin_process(pid: int, cpus: set[int]) -> None:
    # Affinity is per thread: pin each one (threads started later inherit it).
    for task in (PROC / str(pid) / "task").iterdir():
        with contextlib.suppress(ProcessLookupError, FileNotFoundError):
            os.sched_setaffinity(int(task.name), cpus)


def session_pids(sid: int) -> list[int]:
    return [pid for pid, _ in _session_members(sid)]


def pin_session(sid: int, cpus: set[int]) -> None:
    for pid in session_pids(sid):
        with contextlib.suppress(FileNotFoundError):
            _pin_process(pid, cpus)


def pin_self(cpus: set[int]) -> None:
    _pin_process(os.getpid(), cpus)


def allowed_cpus() -> set[int]:
    return set(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else set()


def split(cpus: set[int]) -> tuple[set[int], set[int]] | None:
    """(proxy cores, upstream and load generator cores): the proxy gets the last core to
    itself, everything else shares the rest. None with fewer than two cores."""
    if len(cpus) < 2:
        return None
    ordered = sorted(cpus)
    return {ordered[-1]}, set(ordered[:-1])
