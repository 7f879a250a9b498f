"""The committed results are still what the benchmarks make of their raw records: a change
to a stage that alters a figure, a table or a file's shape shows here (pure, no model)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest

from router.bench.agent.report import ratios
from router.bench.cold import report as cold
from router.bench.overhead.report import added_over_direct, judge_targets
from router.bench.prefill import report as prefill
from router.bench.scorecard import report
from router.bench.sources import report as sources

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


def load(name: str) -> Any:
    return json.loads((EXAMPLES / "results" / name).read_text(encoding="utf-8"))


@pytest.mark.parametrize("name", ["smollm2-135m-cpu", "smollm2-135m-cpu-quick"])
def test_scorecards_render_to_the_committed_files(name: str, tmp_path: Path) -> None:
    committed = EXAMPLES / "scorecards" / name
    shutil.copy(committed / "scorecard.json", tmp_path)
    result = report.from_json(json.loads((tmp_path / "scorecard.json").read_text()))
    charts = [c for c in report.CHARTS if (committed / c).exists()]
    paths = report.write(result, tmp_path, charts)
    for kind in ("json", "markdown"):
        assert paths[kind].read_text() == (committed / paths[kind].name).read_text()


@pytest.mark.parametrize("name", ["overhead.json", "overhead-after-features.json"])
def test_overhead_results_recompute(name: str) -> None:
    data = load(name)
    assert added_over_direct(data["rows"]) == data["added"]
    assert judge_targets(data) == data["targets"]


def test_agent_results_recompute() -> None:
    data = load("agent-bench.json")
    assert ratios(data["results"]) == data["ratios"]


def test_draft_source_results_recompute() -> None:
    data = load("spec-sources.json")
    assert sources.table(data["families"]).split("\n") == data["meta"]["table"]
    assert sources.goals(data["families"]) == data["meta"]["goals"]


def test_prefill_results_render_to_the_committed_table() -> None:
    data = load("prefill.json")
    markdown = (EXAMPLES / "results" / "prefill.md").read_text(encoding="utf-8")
    assert prefill.markdown(data) == markdown


def test_cold_start_results_recompute() -> None:
    data = load("cold-start.json")
    assert cold.summary(data["rounds_detail"]) == data["summary"]
    markdown = (EXAMPLES / "results" / "cold-start.md").read_text(encoding="utf-8")
    assert cold.markdown(data) == markdown
