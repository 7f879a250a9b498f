"""``speclane bench cold``'s command line refuses what it cannot measure before starting
anything."""

from __future__ import annotations

import pytest

from router.bench.cold import cli
from router.bench.cold.run import models_dir_supported


@pytest.mark.parametrize("argv", [["--rounds", "0"], ["--max-tokens", "0"], ["--warm", "-1"]])
def test_counts_below_their_minimum_are_usage_errors(
    argv: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as e:
        cli.main(argv)
    assert e.value.code == 2 and "at least" in capsys.readouterr().err


@pytest.mark.skipif(models_dir_supported(), reason="this router serves a models folder")
def test_on_demand_mode_needs_a_router_with_a_models_folder(
    capsys: pytest.CaptureFixture[str],
) -> None:
    with pytest.raises(SystemExit) as e:
        cli.main(["--mode", "on-demand"])
    assert e.value.code == 2 and "models_dir" in capsys.readouterr().err
