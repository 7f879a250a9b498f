"""Reports what the reliability suite tried, whatever the verbosity (see harness.TALLY).

A plugin of tests/conftest.py, not a conftest of this folder: under pytest-xdist the
controller collects nothing, so only a plugin it loads itself sees the run's end; each worker
hands over its tally when it finishes (``workeroutput``) and the controller adds them up.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest

from tests.reliability.harness import TALLY

WORKER_OUTPUT_KEY = "speclane_reliability"


def pytest_sessionfinish(session: pytest.Session) -> None:
    handover = getattr(session.config, "workeroutput", None)  # set in an xdist worker only
    if handover is not None:
        handover[WORKER_OUTPUT_KEY] = TALLY.as_dict()


@pytest.hookimpl(optionalhook=True)  # a hook of pytest-xdist, in the controller
def pytest_testnodedown(node: Any, error: Any) -> None:
    tally = getattr(node, "workeroutput", {}).get(WORKER_OUTPUT_KEY)
    if tally:
        TALLY.merge(tally)


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    if hasattr(terminalreporter.config, "workeroutput"):
        return  # a worker: the controller reports
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
