"""Pick a fast BLAS for MLX's CPU backend on Linux.

The ``mlx-cpu`` wheel bundles the reference BLAS; Debian's OpenBLAS is many times faster
(docs/lanes.md). It must be preloaded before the worker process starts, so the
supervisor puts it into the worker's environment; a process already running can still load
it before it imports MLX (``load_in_this_process``: the tests that run MLX in-process).

Threads: OpenBLAS starts one thread per core in every process. Two lane processes computing
at once (the separate layout) then run four BLAS threads on two cores, and each waits on the
other's (measured in docs/lanes.md: three editing agents at once took 1.48x as long as with one
BLAS thread per process; one agent alone 0.96x). ``thread_env`` gives each of the processes
that compute at once its share of the cores, unless the user chose; and with ``auto`` the
lanes share the cores as they work (``router.worker.engines.cores``): a lane working alone
takes them all. ``core_share_file`` makes the file they share.
"""

from __future__ import annotations

import atexit
import contextlib
import ctypes
import os
import platform
import sys
import tempfile
from pathlib import Path

_CANDIDATES = (
    "/usr/lib/{arch}-linux-gnu/openblas-pthread/libblas.so.3",
    "/usr/lib/{arch}-linux-gnu/openblas-openmp/libblas.so.3",
    "/usr/lib/{arch}-linux-gnu/libopenblas.so.0",
)


BLAS_THREAD_VARIABLES = ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS")


def blas_threads_for(choice: str | int, processes: int, cpus: int | None) -> int | None:
    """BLAS threads per lane process (pure): ``choice`` an int is that; ``"auto"``: each of
    the ``processes`` computing at once its share of the ``cpus`` (at least one), or None
    (the BLAS's own default) for a process alone."""
    if not isinstance(choice, str):
        return choice
    if processes < 2:
        return None
    return max(1, (cpus or 1) // processes)


def thread_env(
    env: dict[str, str], choice: str | int, processes: int, cpus: int | None
) -> dict[str, str]:
    """``env`` with the BLAS's thread count set as ``blas_threads_for`` says, unless ``env``
    already names one (the user's own choice, from the environment or ``[lanes] env``)."""
    threads = blas_threads_for(choice, processes, cpus)
    if threads is None or any(name in env for name in BLAS_THREAD_VARIABLES):
        return env
    return {**env, "OPENBLAS_NUM_THREADS": str(threads)}


def openblas_path() -> str | None:
    if platform.system() != "Linux":
        return None  # macOS uses Accelerate/Metal; nothing to preload
    arch = platform.machine()
    for pattern in _CANDIDATES:
        path = pattern.format(arch=arch)
        if Path(path).exists():
            return path
    return None


def preload_env(base: dict[str, str] | None = None) -> dict[str, str]:
    """A copy of ``base`` (default: os.environ) with OpenBLAS preloaded when available."""
    env = dict(os.environ if base is None else base)
    if env.get("SPECLANE_NO_OPENBLAS") == "1":
        return env
    path = openblas_path()
    if path and path not in env.get("LD_PRELOAD", ""):
        env["LD_PRELOAD"] = f"{path} {env['LD_PRELOAD']}".strip() if env.get("LD_PRELOAD") else path
    return env


def load_in_this_process() -> bool:
    """What the preload does, for this process: load OpenBLAS with its symbols global
    before ``mlx.core`` is imported, so that MLX's BLAS calls bind to it. False when there
    is none, SPECLANE_NO_OPENBLAS=1, or MLX is already loaded (too late)."""
    if os.environ.get("SPECLANE_NO_OPENBLAS") == "1" or "mlx.core" in sys.modules:
        return False
    path = openblas_path()
    if path is None:
        return False
    ctypes.CDLL(path, mode=ctypes.RTLD_GLOBAL)
    return True


def shares_cores(choice: str | int, processes: int, env: dict[str, str]) -> bool:
    """The lane processes share the cores as they work (pure): ``auto`` threads, two or more
    processes computing at once, OpenBLAS preloaded and no thread count chosen by the user."""
    chosen = any(name in env for name in BLAS_THREAD_VARIABLES)
    preloaded = any("openblas" in part for part in env.get("LD_PRELOAD", "").split())
    return choice == "auto" and processes >= 2 and preloaded and not chosen


def core_share_file(slots: int) -> Path:
    """A new file of ``slots`` zero bytes (0600) for the lanes' core share, removed at exit."""
    fd, name = tempfile.mkstemp(prefix="speclane-cores-")
    try:
        os.write(fd, bytes(slots))
    finally:
        os.close(fd)
    path = Path(name)

    def remove() -> None:
        with contextlib.suppress(OSError):
            path.unlink()

    atexit.register(remove)
    return path
