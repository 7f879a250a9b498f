"""The first screen: ``speclane serve`` on speclane's shipped defaults (the embedded default
model and its draft, the shipped policies, no configuration) logs no warning the newcomer did
not cause. The lanes' workers are the fake worker (no model is loaded): everything else is the
real start-up, from the command line's settings to the listening router."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import sys
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from router.cli.serve import parse_args, settings_from_args
from router.kernel.worker_contract import MODULE
from router.lanes import group
from router.lanes.modelprep import ensure_default_models
from router.server import run

FAKE_WORKER = Path(__file__).parent / "fakes" / "fake_worker.py"


async def test_serving_the_shipped_defaults_logs_no_warning(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    ensure_default_models(quiet=True)  # as ./docker-less-run.sh does before serving
    for name in [n for n in os.environ if n.startswith("SPECLANE_") and n != "SPECLANE_HOME"]:
        monkeypatch.delenv(name)  # a newcomer's environment: no batch key, no settings
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(tmp_path))  # the run's local admin token
    monkeypatch.chdir(tmp_path)  # no ./speclane.toml, no ./policies: the shipped ones
    real = group.build_worker_command

    def fake_worker(*args: Any, **kwargs: Any) -> group.WorkerCommand:
        command = real(*args, **kwargs)
        python, flag, module, *rest = command.argv
        assert (python, flag, module) == (sys.executable, "-m", MODULE)
        return replace(command, argv=(python, str(FAKE_WORKER), *rest))

    monkeypatch.setattr(group, "build_worker_command", fake_worker)
    settings = settings_from_args(parse_args(["--port", "0"]))
    caplog.set_level(logging.INFO)
    ready = asyncio.Event()
    serving = asyncio.create_task(run(settings, ready))
    listening = asyncio.create_task(ready.wait())
    await asyncio.wait({serving, listening}, timeout=120, return_when=asyncio.FIRST_COMPLETED)
    assert ready.is_set(), serving.exception() if serving.done() else "not listening in 120 s"
    serving.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await serving

    warned = [f"{r.name}: {r.getMessage()}" for r in caplog.records if r.levelno >= logging.WARNING]
    assert not warned, warned
    # What was a warning is still said, once, at info.
    said = [r.getMessage() for r in caplog.records]
    assert sum("inactive until $SPECLANE_BATCH_API_KEY is set" in m for m in said) == 1
