"""``speclane bench`` starting its own router on the real default model (slow: realmodel)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import psutil
import pytest

pytestmark = [pytest.mark.realmodel, pytest.mark.timeout(1200)]


def test_bench_starts_its_router_measures_and_stops_it(tmp_path: Path) -> None:
    out = tmp_path / "scorecard"
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "router",
            "bench",
            "--quick",
            "--families",
            "list",
            "--concurrency",
            "1",
            "--scenarios",
            "spec-on,spec-off,auto",
            "--out",
            str(out),
            "--no-progress",
        ],
        capture_output=True,
        text=True,
        timeout=1100,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    data = json.loads((out / "scorecard.json").read_text())
    env = data["environment"]
    assert env["model"] == "SmolLM2-135M-Instruct"
    assert "draft" in (env["draft_model"] or "")
    assert env["num_draft_tokens"] == 3
    assert data["complete"] is True

    def requests(scenario: str) -> list[dict[str, object]]:
        return [m for c in data["cells"] if c["scenario"] == scenario for m in c["measurements"]]

    on, off = requests("spec-on"), requests("spec-off")
    assert on and all(m["ok"] and m["num_draft_tokens"] == 3 for m in on)
    assert sum(m["drafted"] for m in on) > 0  # type: ignore[misc]
    assert off and all(m["ok"] and m["num_draft_tokens"] == 0 for m in off)
    assert all(m["lane"] == "speculative" for m in on + off)
    assert data["pairs"][0]["acceptance"] is not None
    assert (out / "router.log").read_text()
    # the router and its workers are gone with the bench
    pids = [lane["pid"] for lane in env["lanes"] if lane.get("pid")]
    assert len(pids) == 2
    for pid in pids:
        assert not psutil.pid_exists(pid) or psutil.Process(pid).status() == "zombie"
