"""The benchmarks' shared command-line pieces: list arguments and saving results."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import pytest

from router.bench.common.cli import csv, save
from router.bench.overhead import cli as overhead_cli


def test_lists_parse_and_check_their_choices() -> None:
    assert csv(int)("1, 16,64,") == (1, 16, 64)
    assert csv(str, ("chat", "code"))("code,chat") == ("code", "chat")
    for kind, choices, text in ((int, (), "1,x"), (int, (), " , "), (str, ("chat",), "poetry")):
        with pytest.raises(argparse.ArgumentTypeError):
            csv(kind, choices)(text)


def test_a_bad_list_is_a_usage_error_in_every_command(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as e:
        overhead_cli.main(["--concurrency", "1,x"])
    assert e.value.code == 2
    assert "not a comma-separated list" in capsys.readouterr().err


def test_save_writes_json_with_its_folder(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "deep" / "r.json"
    save(path, {"a": [1, 2]})
    assert json.loads(path.read_text()) == {"a": [1, 2]} and path.read_text().endswith("\n")
    assert f"saved {path}" in capsys.readouterr().out
