"""Reports what the reliability suite tried, whatever the verbosity (see harness.TALLY)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from tests.reliability.harness import TALLY


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    lines = TALLY.lines()
    if not lines:
        return
    terminalreporter.section("speclane reliability")
    for line in lines:
        terminalreporter.write_line(line)
    target = os.environ.get("SPECLANE_RELIABILITY_JSON")
    if target:
        Path(target).write_text(json.dumps(TALLY.as_dict(), indent=2) + "\n")
        terminalreporter.write_line(f"written to {target}")
