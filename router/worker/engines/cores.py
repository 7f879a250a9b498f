"""Lane processes sharing the machine's cores: each lane's BLAS threads follow how many
lanes are at work right now.

The separate layout runs two lane processes on one machine. With a thread per core in each,
two busy lanes oversubscribe the cores and wait on each other (docs/lanes.md, "BLAS threads
per lane process"); with half the cores each, a lane working alone leaves the other half idle
(on a 2-core CPU a pass is 15-35 % slower on one thread than on two, measured in
docs/lanes.md). So the supervisor hands the lanes one small shared file, a byte per lane
process (``--core-share``, ``--core-slot``): each lane marks itself busy before it computes and
idle before it waits for work, and before each step sets its BLAS threads to its share of the
cores among the busy lanes (``share``). A lane that died busy leaves its mark set: the other
keeps half the cores until it is back, the safe side.

Changing OpenBLAS's thread count while one of its calls runs is unsafe, so the count changes
only after ``mx.synchronize()`` on the generation thread, the one thread that gives MLX work.
"""

from __future__ import annotations

import ctypes
import logging
import mmap
import os
from collections.abc import Callable
from pathlib import Path

log = logging.getLogger("speclane.worker")


def share(cpus: int, others_busy: int) -> int:
    """BLAS threads for a busy lane (pure): its share of ``cpus`` among itself and the
    ``others_busy`` lanes, at least one."""
    return max(1, cpus // (1 + max(0, others_busy)))


def usable_cpus() -> int:
    """The cores this process may run on."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # not Linux
        return os.cpu_count() or 1


def openblas_threads() -> tuple[Callable[[int], None], Callable[[], int]] | None:
    """OpenBLAS's (set, get) thread-count functions in this process, or None (another BLAS)."""
    try:
        process = ctypes.CDLL(None)
        setter, getter = process.openblas_set_num_threads, process.openblas_get_num_threads
    except (AttributeError, OSError):
        return None
    setter.argtypes, setter.restype = [ctypes.c_int], None
    getter.argtypes, getter.restype = [], ctypes.c_int
    return setter, getter


class CoreShare:
    """This lane's byte in the shared file, and its BLAS threads (generation thread only)."""

    def __init__(
        self,
        path: Path,
        slot: int,
        cpus: int,
        threads: tuple[Callable[[int], None], Callable[[], int]],
        synchronize: Callable[[], None],
    ) -> None:
        with open(path, "r+b") as f:
            self._map = mmap.mmap(f.fileno(), 0)
        if not 0 <= slot < len(self._map):
            raise ValueError(f"core slot {slot} outside the share file ({len(self._map)} slots)")
        self.slot, self.cpus = slot, cpus
        self._set, self._get = threads
        self._synchronize = synchronize
        self.threads = self._get()
        self.changes = 0  # thread-count changes so far (for /health)
        self._busy: bool | None = None

    def working(self, busy: bool) -> None:
        """Called before each step (busy) and before waiting for work (idle)."""
        if busy != self._busy:
            self._map[self.slot] = 1 if busy else 0
            self._busy = busy
        if not busy:
            return
        others = sum(1 for i, mark in enumerate(bytes(self._map)) if mark and i != self.slot)
        wanted = share(self.cpus, others)
        if wanted != self.threads:
            self._synchronize()  # no BLAS call of ours in flight while the pool changes
            self._set(wanted)
            self.threads = wanted
            self.changes += 1

    def report(self) -> dict[str, object]:
        return {"blas_threads": self.threads, "blas_thread_changes": self.changes}


def core_share(
    path: str | None,
    slot: int,
    threads: tuple[Callable[[int], None], Callable[[], int]] | None = None,
) -> CoreShare | None:
    """The lane's ``CoreShare`` from its flags, or None: no file given, not OpenBLAS, or the
    file unusable (removed by a temp cleaner while the router ran, cut short). A lane without
    it keeps the threads it started with (its half): never a reason not to serve."""
    if not path:
        return None
    threads = threads or openblas_threads()
    if threads is None:
        log.info("core share off: this process's BLAS is not OpenBLAS")
        return None
    import mlx.core as mx

    try:
        return CoreShare(Path(path), slot, usable_cpus(), threads, mx.synchronize)
    except (OSError, ValueError) as e:
        log.warning("core share off: %s: %s", path, e)
        return None
