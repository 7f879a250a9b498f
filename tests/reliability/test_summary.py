"""The reliability summary adds up what every process of the run tried (pytest-xdist)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from tests.reliability.harness import Tally

ROOT = Path(__file__).resolve().parents[2]


def test_a_merged_tally_says_what_both_said() -> None:
    first, second, total = Tally(), Tally(), Tally()
    first.fault("gzip_bomb", 2)
    first.fuzz["headers"] += 3
    first.fuzz_status[400] += 3
    first.fuzz_sides["client"] += 3
    first.load["requests"] = 10
    second.fault("gzip_bomb")
    second.fault("never_accepts")
    second.fuzz["headers"] += 1
    second.fuzz_status[502] += 1
    second.fuzz_router_5xx = 1
    second.shutdown["lost"] = 0
    second.memory["growth_mb"] = 1.5
    total.merge(first.as_dict())
    total.merge(second.as_dict())
    assert total.as_dict() == {
        "faults": {"total": 4, "kinds": 2, "by_kind": {"gzip_bomb": 3, "never_accepts": 1}},
        "fuzz": {
            "total": 4,
            "by_family": {"headers": 4},
            "by_status": {"400": 3, "502": 1},
            "router_5xx": 1,
            "by_side": {"client": 3},
        },
        "load": {"requests": 10},
        "shutdown": {"lost": 0},
        "memory": {"growth_mb": 1.5},
    }


FAULTS = """
from tests.reliability.harness import TALLY

def test_{name}():
    TALLY.fault("{name}")
"""


def test_the_summary_of_a_parallel_run_has_what_its_worker_tried(tmp_path: Path) -> None:
    """One worker (each costs a start-up): its tally reaches the controller's summary; the
    adding up of several is the test above."""
    (tmp_path / "conftest.py").write_text('pytest_plugins = ["tests.reliability.summary"]\n')
    for name in ("a", "b"):
        (tmp_path / f"test_{name}.py").write_text(FAULTS.format(name=name))
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-n", "1"],
        cwd=tmp_path,
        env={
            **os.environ,
            "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
        },
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "faults injected: 2 across 2 kinds (a=1, b=1)" in done.stdout, done.stdout[-3000:]
