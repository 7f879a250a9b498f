"""OpenBLAS for MLX: in a process already running (the tests that run MLX in-process), and
its threads per lane process."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from router.config.settings import LanesSettings
from router.lanes.blas import (
    BLAS_THREAD_VARIABLES,
    blas_threads_for,
    core_share_file,
    load_in_this_process,
    openblas_path,
    shares_cores,
    thread_env,
)
from router.lanes.process import build_worker_command

PROBE = """
import sys
from router.lanes.blas import load_in_this_process
loaded = load_in_this_process()
import mlx.core as mx
mx.eval(mx.ones((64, 64)) @ mx.ones((64, 64)))
maps = open("/proc/self/maps").read()
print(loaded, sys.argv[1] in maps, load_in_this_process())
"""


@pytest.mark.skipif(openblas_path() is None, reason="no OpenBLAS on this machine")
def test_loaded_before_mlx_it_is_in_the_process_and_not_twice() -> None:
    path = openblas_path()
    assert path is not None
    done = subprocess.run(
        [sys.executable, "-c", PROBE, path], capture_output=True, text=True, timeout=120
    )
    assert done.stdout.split() == ["True", "True", "False"], done.stderr[-2000:]


def test_after_mlx_it_is_too_late() -> None:
    import mlx.core  # noqa: F401  (this process has MLX already)

    assert load_in_this_process() is False


@pytest.mark.parametrize(
    ("choice", "processes", "cpus", "expected"),
    [
        ("auto", 1, 2, None),  # a process alone keeps the BLAS's default
        ("auto", 2, 2, 1),
        ("auto", 2, 8, 4),
        ("auto", 2, 1, 1),  # never zero
        ("auto", 2, None, 1),
        (3, 1, 2, 3),
        (3, 2, 8, 3),
    ],
)
def test_blas_threads_share_the_cores_between_the_processes_computing_at_once(
    choice: str | int, processes: int, cpus: int | None, expected: int | None
) -> None:
    assert blas_threads_for(choice, processes, cpus) == expected


def test_the_users_own_thread_count_wins() -> None:
    assert thread_env({}, "auto", 2, 2) == {"OPENBLAS_NUM_THREADS": "1"}
    assert thread_env({"OPENBLAS_NUM_THREADS": "2"}, "auto", 2, 2) == {"OPENBLAS_NUM_THREADS": "2"}
    assert thread_env({"OMP_NUM_THREADS": "2"}, 1, 2, 2) == {"OMP_NUM_THREADS": "2"}
    assert thread_env({"A": "b"}, "auto", 1, 2) == {"A": "b"}


def test_the_separate_layouts_workers_get_their_share(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    for name in BLAS_THREAD_VARIABLES:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setattr(os, "cpu_count", lambda: 2)
    two = build_worker_command("batching", LanesSettings(), tmp_path, None, "m", computing=2)
    assert two.env["OPENBLAS_NUM_THREADS"] == "1"
    alone = build_worker_command("shared", LanesSettings(), tmp_path, None, "m")
    assert "OPENBLAS_NUM_THREADS" not in alone.env
    fixed = build_worker_command("shared", LanesSettings(blas_threads=2), tmp_path, None, "m")
    assert fixed.env["OPENBLAS_NUM_THREADS"] == "2"
    own = LanesSettings(env={"OPENBLAS_NUM_THREADS": "2"})
    assert (
        build_worker_command("speculative", own, tmp_path, None, "m", computing=2).env[
            "OPENBLAS_NUM_THREADS"
        ]
        == "2"
    )


def test_two_computing_lanes_share_the_cores_only_with_auto_threads_and_openblas() -> None:
    blas = {"LD_PRELOAD": "/usr/lib/x86_64-linux-gnu/openblas-pthread/libblas.so.3"}
    assert shares_cores("auto", 2, blas)
    assert not shares_cores("auto", 1, blas)  # a process alone has the cores already
    assert not shares_cores(1, 2, blas)  # a count the user set stays as set
    assert not shares_cores("auto", 2, {**blas, "OPENBLAS_NUM_THREADS": "1"})
    assert not shares_cores("auto", 2, {})  # another BLAS (macOS: Accelerate and Metal)


def test_the_separate_layouts_workers_are_handed_the_share_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    for name in BLAS_THREAD_VARIABLES:
        monkeypatch.delenv(name, raising=False)
    share = core_share_file(2)
    assert share.read_bytes() == b"\0\0"
    assert share.stat().st_mode & 0o777 == 0o600
    made = build_worker_command(
        "batching", LanesSettings(), tmp_path, None, "m", computing=2, core_share=(share, 1)
    )
    argv = list(made.argv)
    if openblas_path() is None:
        assert "--core-share" not in argv
        return
    assert argv[argv.index("--core-share") + 1] == str(share)
    assert argv[argv.index("--core-slot") + 1] == "1"
    fixed = build_worker_command(
        "batching", LanesSettings(blas_threads=1), tmp_path, None, "m", computing=2,
        core_share=(share, 1),
    )  # fmt: skip
    assert "--core-share" not in fixed.argv
