"""The fast tier's guard (tests/tiers.py) fails a test that does what only a slow tier may,
and lets the same test pass under its marker."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from tests.tiers import FAST_TIER, serial_run

ROOT = Path(__file__).resolve().parents[1]

PROBES = """
import subprocess, sys
import pytest

def starts_a_worker():
    subprocess.run([sys.executable, "-m", "router.worker", "--help"], capture_output=True)

def test_a_worker_is_refused():
    starts_a_worker()

def test_a_swallowed_refusal_still_fails():
    try:
        starts_a_worker()
    except Exception:
        pass

def test_npm_is_refused():
    subprocess.run(["npm", "--version"], capture_output=True)

@pytest.mark.realmodel
def test_a_worker_under_its_marker():
    starts_a_worker()

def test_other_programs_are_fine():
    subprocess.run([sys.executable, "-c", "pass"], check=True)
"""


def test_the_guard_fails_slow_work_outside_its_tier(tmp_path: Path) -> None:
    (tmp_path / "test_probes.py").write_text(PROBES)
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    command = [sys.executable, "-m", "pytest", "-p", "tests.tiers", "-q", "-rA", "test_probes.py"]
    done = subprocess.run(
        command, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120
    )
    outcomes = {
        line.split(" ")[1].split("::")[-1]: line.split(" ")[0]
        for line in done.stdout.splitlines()
        if line.startswith(("PASSED ", "FAILED "))
    }
    assert outcomes == {
        "test_a_worker_is_refused": "FAILED",
        "test_a_swallowed_refusal_still_fails": "FAILED",
        "test_npm_is_refused": "FAILED",
        "test_a_worker_under_its_marker": "PASSED",
        "test_other_programs_are_fine": "PASSED",
    }, done.stdout[-3000:]
    assert "mark it realmodel" in done.stdout and "mark it clients" in done.stdout


def test_only_the_fast_tier_of_more_than_one_file_runs_in_parallel(tmp_path: Path) -> None:
    fast = "not realmodel and not clients"
    one = tmp_path / "test_one.py"
    one.write_text("")
    assert not serial_run(fast, ["tests"])
    assert not serial_run(" not realmodel  and not clients ", ["tests"])
    assert not serial_run(fast, [str(one), "tests"])
    assert serial_run(fast, [str(one)])
    assert serial_run(fast, [f"{one}::test_a", f"{one}::test_b"])
    for slow in ("realmodel", "clients", "realmodel and not clients", "", "not realmodel"):
        assert serial_run(slow, ["tests"]), slow


WHERE = """
import os

def test_{name}():
    with open("ran-{name}", "w") as f:
        f.write(os.environ.get("PYTEST_XDIST_WORKER", "main"))
"""


def test_n_auto_gives_the_fast_tier_workers_and_a_slow_tier_none(tmp_path: Path) -> None:
    """The hook is wired: with ``-n auto`` (addopts) the fast tier's tests run in xdist's
    workers, the realmodel tier's in pytest's own process."""
    for name in ("a", "b"):
        (tmp_path / f"test_{name}.py").write_text(WHERE.format(name=name))
    path = os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])
    # Not this run's worker name (PYTEST_XDIST_WORKER) when this test runs in a worker.
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST_XDIST_")}
    env.update(PYTHONPATH=path, PYTEST_XDIST_AUTO_NUM_WORKERS="2")
    ran = {}
    for tier in ("not realmodel and not clients", "realmodel or not realmodel"):
        command = [sys.executable, "-m", "pytest", "-p", "tests.tiers", "-q", "-n", "auto"]
        done = subprocess.run(
            [*command, "--dist", "loadfile", "-m", tier],
            cwd=tmp_path,
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
        ran[tier] = {(tmp_path / f"ran-{n}").read_text() for n in ("a", "b")}
    assert ran["not realmodel and not clients"] <= {"gw0", "gw1"}
    assert ran["realmodel or not realmodel"] == {"main"}


def test_addopts_runs_the_fast_tier_on_xdist() -> None:
    """The expression serial_run knows as the fast tier is the one `pytest` alone selects."""
    import tomllib

    addopts = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["pytest"]["ini_options"][
        "addopts"
    ]
    assert addopts[addopts.index("-m") + 1] == FAST_TIER
    assert addopts[addopts.index("-n") + 1] == "auto"


def test_the_fast_tier_runs_two_workers_a_core_within_a_bound() -> None:
    from tests.tiers import MAX_FAST_WORKERS, fast_workers

    assert [fast_workers(n) for n in (1, 2, 4)] == [2, 4, 8]
    assert fast_workers(64) == MAX_FAST_WORKERS and fast_workers(0) == 1
