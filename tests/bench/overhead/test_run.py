"""``speclane bench overhead``: a short real run (upstream, speclane, load generator)."""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path

import pytest

from router.bench.common import procs
from router.bench.overhead import cpu, report, run
from router.cli import bench as cli


def test_a_short_run_measures_both_stream_lengths_and_judges_the_targets(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out, flags = tmp_path / "o.json", "--concurrency 1,64 --tokens 7,40 --seconds 0.4 --rounds 2"
    argv = [*flags.split(), "--warmup", "0.1", "--nginx", "off", "--cpus", "shared"]
    assert cli.main(["overhead", *argv, "--out", str(out)]) == 0
    printed, result = capsys.readouterr().out, json.loads(out.read_text())
    assert "| speclane | shared | 64 | 40 |" in printed and "target < 1 ms" in printed
    assert "added TTFT p50 at concurrency 1, 7-token streams" in printed
    rows, seconds = result["rows"], result["seconds_per_level"] * result["rounds"]  # pooled
    assert {(r["target"], r["concurrency"], r["tokens"]) for r in rows} == {
        (t, c, n) for t in ("direct", "speclane") for c in (1, 64) for n in (7, 40)
    }
    for r in rows:
        assert r["errors"] == 0 and r["requests"] > 0
        assert r["cpus"] == "shared"
        roles = {"upstream", "loadgen"} | ({"proxy"} if r["target"] == "speclane" else set())
        if cpu.supported():
            assert set(r["cpu_us_per_stream"]) == roles
            assert all(v > 0 for v in r["cpu_us_per_stream"].values())
        # role chunk + tokens + finish chunk + [DONE], every one relayed
        per_stream = r["tokens"] + 3
        assert r["chunks_per_s"] == pytest.approx(r["requests"] * per_stream / seconds, rel=0.5)
    plain = {(r["tokens"], r["plain_requests_per_s"] is not None) for r in rows}
    assert plain == {(7, True), (40, False)}
    targets = result["targets"]
    judged = [(t["target"].split()[0], t["tokens"]) for t in targets]
    assert judged == [("added", 7), ("relayed", 7), ("added", 40), ("relayed", 40)]
    assert all(a["proxy_cpu_us_per_stream"] for a in result["added"]) or not cpu.supported()


@pytest.mark.skipif(not run.layouts_for("own-core"), reason="needs Linux and two cores")
async def test_own_core_layout_pins_the_proxy_apart_and_gives_this_process_its_cores_back() -> None:
    everything = cpu.allowed_cpus()
    proxy_cores, rest = cpu.split(everything)  # type: ignore[misc]
    targets: dict[str, procs.Served] = {}
    seen: dict[tuple[str, str], dict[str, set[int]]] = {}
    arrange, measure = run._arrange, run.measure

    def recording(layout: str, served: dict[str, procs.Served], cores: set[int]) -> None:
        targets.update(served)
        arrange(layout, served, cores)

    async def watching(level: run.Level, *args: object, **kwargs: object) -> run.Level:
        # While a cell is measured: where each process may run, every thread of it.
        seen[(level.cpus, level.target)] = {
            "loadgen": cpu.allowed_cpus(),
            **{name: _cores_of(s.sid) for name, s in targets.items()},
        }
        return await measure(level, *args, **kwargs)  # type: ignore[arg-type]

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(run, "_arrange", recording)
        mp.setattr(run, "measure", watching)
        cell = {"concurrency": [1], "tokens": [7], "seconds": 0.3, "warmup": 0.1, "rounds": 1}
        result = await run.run(argparse.Namespace(**cell, nginx="off", cpus="both"))
    # Each target of a layout is measured with the same placement, direct included.
    shared = {"loadgen": everything, "direct": everything, "speclane": everything}
    pinned = {"loadgen": rest, "direct": rest, "speclane": proxy_cores}
    assert seen == {
        ("shared", "direct"): shared,
        ("shared", "speclane"): shared,
        ("own-core", "direct"): pinned,
        ("own-core", "speclane"): pinned,
    }
    assert cpu.allowed_cpus() == everything  # the test process has its cores back
    assert [(r["target"], r["cpus"]) for r in result["rows"]] == [
        ("direct", "shared"),
        ("speclane", "shared"),
        ("direct", "own-core"),
        ("speclane", "own-core"),
    ]
    assert [(t["cpus"], t["tokens"]) for t in result["targets"]] == [("shared", 7), ("own-core", 7)]
    assert result["layouts"] == ["shared", "own-core"]


def _cores_of(sid: int) -> set[int]:
    """The cores a session's threads may use; they must agree."""
    found = {
        frozenset(os.sched_getaffinity(int(task)))
        for pid in cpu.session_pids(sid)
        for task in os.listdir(f"/proc/{pid}/task")
    }
    assert len(found) == 1, found
    return set(next(iter(found)))


def test_targets_are_judged_from_the_added_rows() -> None:
    def added(target: str, concurrency: int, tokens: int, ttft: float, chunks: float) -> dict:
        figures = {"added_ttft_p50_ms": ttft, "chunks_vs_direct": chunks}
        return {"target": target, "concurrency": concurrency, "tokens": tokens, **figures}

    rows = [
        added("speclane", 1, 7, 0.9, 0.5),
        added("speclane", 64, 7, 9.0, 0.79),
        added("speclane", 64, 256, 9.0, 0.81),
        added("nginx", 64, 7, 1.0, 0.9),
    ]
    assert [t["met"] for t in report.judge_targets({"added": rows})] == [True, False, True]
