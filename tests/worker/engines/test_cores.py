"""router.worker.engines.cores: the lanes' BLAS threads follow how many lanes are at work."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from router.lanes.blas import core_share_file, openblas_path
from router.worker.engines.batching import BatchingEngine
from router.worker.engines.cores import CoreShare, core_share, share
from router.worker.engines.engine import Models


@pytest.mark.parametrize(
    ("cpus", "others", "expected"),
    [(2, 0, 2), (2, 1, 1), (8, 1, 4), (8, 3, 2), (1, 0, 1), (1, 1, 1), (3, 1, 1), (2, -1, 2)],
)
def test_a_busy_lane_takes_its_share_of_the_cores(cpus: int, others: int, expected: int) -> None:
    assert share(cpus, others) == expected


class FakeBlas:
    """A BLAS thread count, and what happened to it, in order."""

    def __init__(self, log: list[str], name: str) -> None:
        self.threads, self.log, self.name = 1, log, name

    def set(self, n: int) -> None:
        self.log.append(f"{self.name} set {n}")
        self.threads = n

    def get(self) -> int:
        return self.threads

    def synchronize(self) -> None:
        self.log.append(f"{self.name} sync")


def lane(path: Path, slot: int, log: list[str]) -> tuple[CoreShare, FakeBlas]:
    blas = FakeBlas(log, f"lane{slot}")
    return CoreShare(path, slot, 2, (blas.set, blas.get), blas.synchronize), blas


def test_two_lanes_take_the_cores_as_they_work(tmp_path: Path) -> None:
    path = tmp_path / "cores"
    path.write_bytes(b"\0\0")
    log: list[str] = []
    a, blas_a = lane(path, 0, log)
    b, blas_b = lane(path, 1, log)
    a.working(True)  # alone at work: both cores, synchronized before the change
    assert (blas_a.threads, log) == (2, ["lane0 sync", "lane0 set 2"])
    b.working(True)  # the other lane sees the first one at work
    assert blas_b.threads == 1
    a.working(True)  # and the first one gives a core back at its next step
    assert blas_a.threads == 1
    assert path.read_bytes() == b"\1\1"
    b.working(False)  # idle: its mark goes; its threads no longer matter
    assert path.read_bytes() == b"\1\0"
    a.working(True)
    assert blas_a.threads == 2
    log.clear()
    a.working(True)  # nothing changed: no synchronizing, no call into the BLAS
    assert log == []
    assert a.report() == {"blas_threads": 2, "blas_thread_changes": 3}


def test_a_slot_outside_the_file_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "cores"
    path.write_bytes(b"\0\0")
    with pytest.raises(ValueError, match="slot 2"):
        lane(path, 2, [])


def test_no_share_file_or_an_unusable_one_means_no_share_never_no_lane(tmp_path: Path) -> None:
    blas = FakeBlas([], "lane")
    threads = (blas.set, blas.get)
    assert core_share(None, 0, threads) is None
    assert core_share(str(tmp_path / "gone"), 0, threads) is None  # a temp cleaner took it
    (tmp_path / "empty").write_bytes(b"")
    assert core_share(str(tmp_path / "empty"), 0, threads) is None  # cut short
    (tmp_path / "one").write_bytes(b"\0")
    assert core_share(str(tmp_path / "one"), 1, threads) is None  # no byte for this slot
    share = core_share(str(core_share_file(2)), 1, threads)
    assert share is not None and share.slot == 1
    assert blas.threads == 1  # nothing changed by opening it


PROBE = """
import sys
from router.worker.engines.cores import core_share
share = core_share(sys.argv[1], 0)
import mlx.core as mx
share.working(True)
mx.eval(mx.ones((256, 256)) @ mx.ones((256, 256)))
print(share.threads, share._get())
"""


@pytest.mark.skipif(openblas_path() is None, reason="no OpenBLAS on this machine")
def test_the_real_openblas_thread_count_follows_the_share() -> None:
    """In a lane's own process: OpenBLAS preloaded and started with one thread, as the
    supervisor starts a separate-layout lane, takes both cores when it works alone."""
    path = core_share_file(2)
    env = {"LD_PRELOAD": str(openblas_path()), "OPENBLAS_NUM_THREADS": "1", "PATH": "/usr/bin"}
    done = subprocess.run(
        [sys.executable, "-c", PROBE, str(path)],
        capture_output=True, text=True, timeout=120, env=env,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    expected = min(2, len(os.sched_getaffinity(0)))
    assert done.stdout.split() == [str(expected), str(expected)]
    assert path.read_bytes() == b"\1\0"


def test_a_lane_prices_its_passes_at_the_thread_count_it_runs_on(tmp_path: Path) -> None:
    """The engine hands its share's count to its pass cost before each step, so the passes
    it times and the drafts it prices are at the count they run on (#45)."""
    path = tmp_path / "cores"
    path.write_bytes(b"\0\0")
    log: list[str] = []
    engine = BatchingEngine(lambda: Models(None, None), 4)
    engine.cores, _ = lane(path, 0, log)
    other, _ = lane(path, 1, log)
    engine.working(True)
    assert engine.pass_cost.threads == 2
    other.working(True)
    engine.working(True)
    assert engine.pass_cost.threads == 1
    engine.working(False)  # idle: the count it last ran on stays
    assert engine.pass_cost.threads == 1
