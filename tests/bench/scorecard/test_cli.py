"""``speclane bench`` arguments: defaults, --quick, explicit dimensions, --render, --plot."""

from __future__ import annotations

from pathlib import Path

import pytest

from router.bench.scorecard import cli as scorecard_cli
from router.bench.scorecard import plot, report
from router.bench.scorecard.plan import DEFAULT_BUDGET, DEFAULT_SPEC, QUICK_BUDGET, QUICK_SPEC
from router.bench.scorecard.run import normalize_url
from tests.bench.scorecard.test_report import result


def opts(*argv: str):  # type: ignore[no-untyped-def]
    return scorecard_cli.options(scorecard_cli.parser().parse_args(list(argv)))


def test_defaults() -> None:
    o = opts()
    assert o.spec == DEFAULT_SPEC and o.budget == DEFAULT_BUDGET
    assert o.fixed == frozenset() and o.url is None and o.plot is False
    assert o.lanes.max_batch_size == 8


def test_quick_and_explicit_dimensions() -> None:
    o = opts("--quick", "--concurrency", "1,16", "--families", "code,long", "--max-tokens", "40")
    assert o.budget == QUICK_BUDGET
    assert o.spec.concurrency == (1, 16) and o.spec.families == ("code", "long")
    assert o.spec.max_tokens == 40 and o.spec.runs == QUICK_SPEC.runs
    assert o.fixed == frozenset({"concurrency", "families", "max_tokens"})
    assert o.lanes.max_batch_size == 16  # the batching lane must hold the highest level


def test_lane_and_gate_flags() -> None:
    o = opts(
        "--model",
        "/m",
        "--draft-model",
        "/d",
        "--num-draft-tokens",
        "5",
        "--acceptance-floor",
        "0.6",
        "--target-concurrency",
        "4",
        "--budget",
        "0",
    )
    assert (o.lanes.model, o.lanes.draft_model, o.lanes.num_draft_tokens) == ("/m", "/d", 5)
    assert o.thresholds.acceptance_floor == 0.6 and o.thresholds.target_concurrency == 4
    assert o.budget == 0


@pytest.mark.parametrize(
    "argv", [["--families", "poetry"], ["--concurrency", "1,x"], ["--scenarios", ""]]
)
def test_bad_lists_are_usage_errors(argv: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as e:
        scorecard_cli.main(argv)
    assert e.value.code == 2
    assert "speclane bench: error" in capsys.readouterr().err


def test_plot_without_matplotlib_stops_before_measuring(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(plot, "available", lambda: False)
    assert scorecard_cli.main(["--plot", "--url", "http://127.0.0.1:9/v1"]) == 2
    assert "pip install 'speclane[plot]'" in capsys.readouterr().err


def test_render_rewrites_the_markdown_from_the_json(tmp_path: Path) -> None:
    paths = report.write(result(), tmp_path)
    paths["markdown"].write_text("stale")
    assert scorecard_cli.main(["--render", str(paths["json"])]) == 0
    assert paths["markdown"].read_text().startswith("# Speculative decoding readiness")


def test_render_of_a_wrong_file_fails(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    bad = tmp_path / "x.json"
    bad.write_text("{}")
    assert scorecard_cli.main(["--render", str(bad)]) == 1
    assert "cannot read" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("url", "base"),
    [
        ("http://127.0.0.1:8080", "http://127.0.0.1:8080/v1"),
        ("http://127.0.0.1:8080/v1/", "http://127.0.0.1:8080/v1"),
    ],
)
def test_urls_are_normalised(url: str, base: str) -> None:
    assert normalize_url(url) == base
