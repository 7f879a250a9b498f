"""``speclane bench ...`` arguments: list flags, saving results, and the scorecard's defaults,
--quick, explicit dimensions, --render, --plot."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import pytest

from router.bench.scorecard import plot, report
from router.bench.scorecard.plan import DEFAULT_BUDGET, DEFAULT_SPEC, QUICK_BUDGET, QUICK_SPEC
from router.bench.scorecard.run import normalize_url
from router.bench.session import run as session_run
from router.cli import bench as cli
from router.config.names import LANE_NAMES
from tests.bench.scorecard.test_report import result


def test_lists_parse_and_check_their_choices() -> None:
    assert cli.csv(int)("1, 16,64,") == (1, 16, 64)
    assert cli.csv(str, ("chat", "code"))("code,chat") == ("code", "chat")
    for kind, choices, text in ((int, (), "1,x"), (int, (), " , "), (str, ("chat",), "poetry")):
        with pytest.raises(argparse.ArgumentTypeError):
            cli.csv(kind, choices)(text)


def test_a_bad_list_is_a_usage_error_in_every_command(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as e:
        cli.main(["overhead", "--concurrency", "1,x"])
    assert e.value.code == 2
    assert "not a comma-separated list" in capsys.readouterr().err


def test_save_writes_json_with_its_folder(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "deep" / "r.json"
    cli.save(path, {"a": [1, 2]})
    assert json.loads(path.read_text()) == {"a": [1, 2]} and path.read_text().endswith("\n")
    assert f"saved {path}" in capsys.readouterr().out


@pytest.mark.parametrize("argv", [["lanes", "--targets", "nginx"], ["agent", "--turns", "x"]])
def test_each_benchmarks_flags_are_checked(argv: list[str]) -> None:
    with pytest.raises(SystemExit) as e:
        cli.main(argv)
    assert e.value.code == 2


def opts(*argv: str):  # type: ignore[no-untyped-def]
    return cli.scorecard_options(cli.scorecard_parser().parse_args(list(argv)))


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
        cli.main(argv)
    assert e.value.code == 2
    assert "speclane bench: error" in capsys.readouterr().err


def test_plot_without_matplotlib_stops_before_measuring(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(plot, "available", lambda: False)
    assert cli.main(["--plot", "--url", "http://127.0.0.1:9/v1"]) == 2
    assert "pip install 'speclane[plot]'" in capsys.readouterr().err


def test_render_rewrites_the_markdown_from_the_json(tmp_path: Path) -> None:
    paths = report.write(result(), tmp_path)
    paths["markdown"].write_text("stale")
    assert cli.main(["--render", str(paths["json"])]) == 0
    assert paths["markdown"].read_text().startswith("# Speculative decoding readiness")


def test_render_of_a_wrong_file_fails(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    bad = tmp_path / "x.json"
    bad.write_text("{}")
    assert cli.main(["--render", str(bad)]) == 1
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


@pytest.mark.parametrize("argv", [["--rounds", "0"], ["--max-tokens", "0"], ["--warm", "-1"]])
def test_bench_cold_counts_below_their_minimum_are_usage_errors(
    argv: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as e:
        cli.main(["cold", *argv])
    assert e.value.code == 2 and "at least" in capsys.readouterr().err


def test_session_targets_include_each_lane_held_by_the_header() -> None:
    parse = cli.csv(str, session_run.CHOICES)
    assert parse("mlx_lm.server,speclane@batching") == ("mlx_lm.server", "speclane@batching")
    assert {f"speclane@{lane}" for lane in LANE_NAMES} <= set(session_run.CHOICES)
    assert not set(session_run.TARGETS) & {f"speclane@{lane}" for lane in LANE_NAMES}
    with pytest.raises(argparse.ArgumentTypeError):
        parse("speclane@nowhere")
