"""The test tiers, and the guard that keeps the fast one fast.

``pytest`` alone runs the fast tier (``addopts`` in pyproject.toml: no model, no agent
programs); ``-m realmodel`` the tests that load the default model or run real MLX workers;
``-m clients`` the agent programs (every test under ``tests/clients`` carries the marker).

A test outside ``realmodel`` that starts a lane worker (``python -m router.worker``) or
``mlx_lm.server``, or loads a real model's weights the way mlx-lm does, fails and says why;
so does one outside ``clients`` that runs npm, npx or an agent program. The guard is an
audit hook: it sees ``subprocess.Popen`` whoever calls it (asyncio's subprocesses too),
raises in the call, and fails the test at its end even if the code under test swallowed
that error.

The fast tier runs in parallel (pytest-xdist: ``-n auto --dist loadfile`` in ``addopts``,
two workers per core, each file whole on one worker); the slow tiers, and a run of one file,
run in this process (``pytest_xdist_auto_num_workers``): the slow tiers load MLX models,
and two of those at once on two cores only thrash.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

CLIENTS_DIR = Path(__file__).resolve().parent / "clients"

# What only the realmodel tier may start: module names after ``-m``, or programs.
REALMODEL_MODULES = frozenset({"router.worker", "mlx_lm.server", "mlx_lm"})
# npm installs the agents and runs them (node alone is fine: Playwright's driver is node).
CLIENT_PROGRAMS = frozenset({"npm", "npx", "claude", "codex", "qwen", "aider"})
# mlx-lm's ``load_model`` finds the weights with this pattern (``glob.glob``).
WEIGHTS_GLOB = "model*.safetensors"
# Weights this large are a real model (the default one has 538 MB); tests' tiny models are KiB.
REAL_WEIGHTS_BYTES = 16 << 20
# The marker expression of the fast tier (``addopts``), the one tier that runs in parallel.
FAST_TIER = "not realmodel and not clients"


class TierViolation(RuntimeError):
    """A fast-tier test did what only the realmodel or clients tier may do."""


class _Guard:
    def __init__(self) -> None:
        self.markers: frozenset[str] | None = None  # the running test's, None between tests
        self.violations: list[str] = []

    def audit(self, event: str, args: tuple[Any, ...]) -> None:
        markers = self.markers
        if markers is None:
            return
        found = None
        if event == "subprocess.Popen":
            found = _forbidden_command(args[0], args[1], markers)
        elif event == "glob.glob" and "realmodel" not in markers:
            found = _real_weights(str(args[0]))
        if found is not None:
            self.violations.append(found)
            raise TierViolation(found)


def _real_weights(pattern: str) -> str | None:
    """mlx-lm about to load a real model's weights (a tiny model a test makes is fine)."""
    if not pattern.endswith(WEIGHTS_GLOB):
        return None
    folder = Path(pattern).parent
    size = sum(p.stat().st_size for p in folder.glob(WEIGHTS_GLOB) if p.is_file())
    if size < REAL_WEIGHTS_BYTES:
        return None
    return f"loads a model ({folder}, {size >> 20} MiB of weights): mark it realmodel"


def _words(argv: Any) -> list[str]:
    if isinstance(argv, str | bytes | os.PathLike):
        return [os.fsdecode(argv)]
    return [os.fsdecode(a) for a in argv or ()]


def _forbidden_command(executable: Any, argv: Any, markers: frozenset[str]) -> str | None:
    words = _words(argv)
    programs = {Path(w).name for w in [*_words(executable), *words[:1]] if w}
    modules = {words[i + 1] for i, w in enumerate(words[:-1]) if w == "-m"}
    if "realmodel" not in markers and modules & REALMODEL_MODULES:
        return f"starts {' '.join(words[:4])} ...: mark it realmodel"
    if "clients" not in markers and programs & CLIENT_PROGRAMS:
        return f"runs {' '.join(words[:3])} ...: mark it clients"
    return None


def serial_run(markexpr: str, args: list[str]) -> bool:
    """Whether a run with ``-n auto`` stays in this process: any selection but the fast tier's
    (realmodel, clients, ``-m ""``), or tests of one file only (a worker's start-up would cost
    more than it saves)."""
    if " ".join(markexpr.split()) != FAST_TIER:
        return True
    files = {a.split("::")[0] for a in args}
    return len(files) == 1 and Path(next(iter(files))).is_file()


# The fast tier waits on loopback servers, subprocesses and timeouts more than it computes,
# so two workers per core finish it sooner than one (measured in docs/development.md).
FAST_WORKERS_PER_CORE = 2
MAX_FAST_WORKERS = 16  # past this, each worker's own collection costs more than it saves


def fast_workers(cores: int) -> int:
    return max(1, min(MAX_FAST_WORKERS, FAST_WORKERS_PER_CORE * cores))


@pytest.hookimpl(optionalhook=True, tryfirst=True)  # pytest-xdist asks, for ``-n auto``
def pytest_xdist_auto_num_workers(config: pytest.Config) -> int | None:
    """0 (no workers) for a serial run; else ``PYTEST_XDIST_AUTO_NUM_WORKERS`` if set (None:
    xdist reads it), or ``fast_workers`` of the cores this process may run on."""
    if serial_run(config.option.markexpr, list(config.args)):
        return 0
    if os.environ.get("PYTEST_XDIST_AUTO_NUM_WORKERS"):
        return None
    return fast_workers(
        len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    )


GUARD = _Guard()
sys.addaudithook(GUARD.audit)


@pytest.hookimpl(tryfirst=True)  # before -m deselects by marker
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Every test under tests/clients is in the clients tier (the agent programs and the
    installer that fetches them)."""
    for item in items:
        if CLIENTS_DIR in item.path.parents:
            item.add_marker(pytest.mark.clients)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None) -> Iterator[None]:
    GUARD.markers = frozenset(m.name for m in item.iter_markers())
    GUARD.violations.clear()
    try:
        return (yield)
    finally:
        GUARD.markers = None


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item: pytest.Item) -> Iterator[None]:
    result = yield
    if GUARD.violations:
        pytest.fail(f"{item.nodeid} is not a fast test: {GUARD.violations[0]}", pytrace=False)
    return result
