"""The fast tier's guard (tests/tiers.py) fails a test that does what only a slow tier may,
and lets the same test pass under its marker."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

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
