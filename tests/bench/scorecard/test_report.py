"""The Markdown scorecard and the JSON file, from a hand-built result."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from router.bench.scorecard import plot, report
from router.bench.scorecard.plan import MatrixSpec, Plan
from router.bench.scorecard.report import SCHEMA, Result, from_json, to_json
from router.bench.scorecard.score import Thresholds
from tests.bench.scorecard.build import cell, req
from tests.bench.scorecard.test_score import matrix

ENV = {
    "date": "2026-01-01T00:00:00+00:00",
    "model": "target-x",
    "draft_model": "draft-y",
    "num_draft_tokens": 3,
    "router": "attached",
    "versions": {"speclane": "0.1.0", "mlx": "0.1", "mlx-lm": "0.2"},
    "hardware": {"machine": "x86_64", "cpus": 2},
    "load_average": {"start": [1.5, 1.0, 1.0], "end": [2.5, 1.0, 1.0]},
}


def result(complete: bool = True) -> Result:
    spec = MatrixSpec(families=("chat",), concurrency=(1, 4), runs=1, max_tokens=24)
    runs = matrix()
    runs.append(
        cell("batching", "chat", 1, [req("batching", ok=False, error="HTTP 503: lane down")], 1.0)
    )
    return Result(
        spec,
        Plan(spec, spec.cells()),
        Thresholds(),
        dict(ENV),
        [req("spec-on")],
        runs,
        complete=complete,
        stopped=None if complete else "stopped by the user",
        budget=480.0,
        duration=65.0,
    )


def test_markdown_has_every_section_with_its_figures() -> None:
    r = result()
    text = report.render(r, r.evaluation())
    for heading in (
        "# Speculative decoding readiness scorecard",
        "## Environment",
        "## Gates",
        "## Where speculation stops paying",
        "## Acceptance by prompt family",
        "## Readiness score: ",
        "## Results by scenario",
        "## Errors",
        "## How this was measured",
    ):
        assert heading in text
    assert "**Verdict: NOT READY: requests failed**" in text
    assert "| Draft | draft-y (3 draft tokens per round) |" in text
    assert "| Acceptance floor (model pair) |" in text and "0.50 (30/60 drafted tokens)" in text
    assert "Speculation stops paying at **concurrency 4**." in text
    assert "| batching | HTTP 503: lane down | 1 |" in text
    assert "load average 1.5 at the start, 2.5 at the end" in text
    # every scenario has its table and the lane column reads the headers
    for title in (
        "Speculative lane, speculation on",
        "Speculative lane, speculation off",
        "Batching lane",
        "Router's automatic routing",
    ):
        assert f"### {title}" in text
    assert "speculative 1 (1 with draft)" in text
    assert "_This run is partial" not in text


def test_partial_run_says_so() -> None:
    r = result(complete=False)
    text = report.render(r, r.evaluation())
    assert "(partial run)" in text and "_This run is partial: stopped by the user." in text


def test_json_holds_raw_measurements_environment_and_pair(tmp_path: Path) -> None:
    r = result()
    paths = report.write(r, tmp_path)
    data = json.loads(paths["json"].read_text())
    assert data["schema"] == SCHEMA
    assert data["environment"]["model"] == "target-x"
    assert len(data["cells"]) == len(r.runs)
    first = data["cells"][0]
    assert first["measurements"][0]["ttft"] == pytest.approx(0.11)
    assert first["summary"]["decode_tps_avg"] == pytest.approx(20.0)
    assert data["evaluation"]["score"] == r.evaluation().score
    (pair,) = data["pairs"]
    assert pair["target"] == "target-x" and pair["draft"] == "draft-y"
    assert pair["acceptance"] == pytest.approx(0.5)
    assert pair["acceptance_by_family"] == {"chat": pytest.approx(0.5)}
    assert pair["passed_floor"] is True and pair["floor"] == 0.45
    assert data["settings"]["plan"]["budget_s"] == 480.0


def test_json_reads_back_into_the_same_evaluation() -> None:
    r = result()
    again = from_json(json.loads(json.dumps(to_json(r, r.evaluation()))))
    assert again.runs == r.runs and again.plan.cells == r.plan.cells
    assert again.evaluation() == r.evaluation()
    with pytest.raises(ValueError, match="not a speclane scorecard"):
        from_json({"schema": "other"})


def test_charts_are_written_and_linked(tmp_path: Path) -> None:
    pytest.importorskip("matplotlib")
    r = result()
    names = plot.write_charts(r, tmp_path)
    assert names == list(report.CHARTS)
    for name in names:
        assert (tmp_path / name).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    text = report.render(r, r.evaluation(), names)
    assert "![TTFT by concurrency](ttft_by_concurrency.png)" in text


def test_missing_matplotlib_is_a_clear_message(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    import builtins

    real_import = builtins.__import__

    def no_matplotlib(name: str, *args: object, **kwargs: object) -> object:
        if name.startswith("matplotlib"):
            raise ImportError(name)
        return real_import(name, *args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(builtins, "__import__", no_matplotlib)
    assert plot.available() is False
    r = result()
    with pytest.raises(plot.PlotUnavailable, match=r"pip install 'speclane\[plot\]'"):
        plot.write_charts(r, tmp_path)


def test_markdown_records_the_pair_as_a_gating_rule() -> None:
    import tomllib

    from router.config.gating import GatingSettings

    r = result()
    text = report.render(r, r.evaluation())
    block = text.split("## Model pair rule", 1)[1].split("```toml\n", 1)[1].split("```", 1)[0]
    gating = GatingSettings(**tomllib.loads(block)["gating"])
    (rule,) = gating.pairs
    assert (rule.target, rule.draft) == ("target-x", "draft-y")
    assert rule.measured_acceptance == pytest.approx(r.evaluation().acceptance, abs=1e-3)
