"""OpenBLAS for MLX in a process already running (the tests that run MLX in-process)."""

from __future__ import annotations

import subprocess
import sys

import pytest

from router.lanes.blas import load_in_this_process, openblas_path

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
