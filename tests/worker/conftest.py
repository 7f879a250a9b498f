"""Real worker processes on the prepared default model (for the ``realmodel`` tests).

``spec_worker`` and ``batch_worker`` are started once per session and shared by the tests
that send them requests (``prepared_models``, ``loaded_models``: tests/realmodel.py). A test
that needs a worker started otherwise starts its own (``start_worker``, ``worker_factory``)."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import tempfile
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

import pytest

from router.kernel.worker_contract import READY_PREFIX
from router.lanes.blas import preload_env

READY_TIMEOUT = 180.0  # loading competes for 2 shared cores
BATCH_SIZE = 4


def worker_command(model: Path, mode: str, *extra: str) -> list[str]:
    return [sys.executable, "-m", "router.worker", "--mode", mode, "--model", str(model), *extra]


def read_line(stream: IO[str], timeout: float) -> str:
    """One line from a pipe, or '' when nothing came within ``timeout``."""
    lines: list[str] = []
    reader = threading.Thread(target=lambda: lines.append(stream.readline()), daemon=True)
    reader.start()
    reader.join(timeout)
    return lines[0] if lines else ""


@dataclass
class WorkerProcess:
    proc: subprocess.Popen[str]
    ready: dict[str, Any]
    stderr: IO[str]
    stdout_lines: list[str] = field(default_factory=list)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.ready['port']}"

    def stderr_tail(self) -> str:
        self.stderr.seek(0)
        return "".join(self.stderr.readlines()[-20:])

    def stop(self) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        try:
            return self.proc.wait(15)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            return self.proc.wait(5)


def spawn(command: list[str], stderr: IO[str]) -> subprocess.Popen[str]:
    return subprocess.Popen(
        command, stdout=subprocess.PIPE, stderr=stderr, text=True, env=preload_env()
    )


def wait_ready(proc: subprocess.Popen[str], stderr: IO[str]) -> WorkerProcess:
    assert proc.stdout is not None
    line = read_line(proc.stdout, READY_TIMEOUT)
    if not line.startswith(READY_PREFIX):
        proc.kill()
        stderr.seek(0)
        pytest.fail(f"worker not ready (stdout {line!r}); stderr:\n{stderr.read()[-3000:]}")
    ready = json.loads(line[len(READY_PREFIX) :])
    return WorkerProcess(proc, ready, stderr, [line])


def start_worker(command: list[str]) -> WorkerProcess:
    stderr = tempfile.TemporaryFile("w+")
    return wait_ready(spawn(command, stderr), stderr)


@pytest.fixture
def worker_factory() -> Iterator[Any]:
    started: list[WorkerProcess] = []

    def factory(command: list[str]) -> WorkerProcess:
        worker = start_worker(command)
        started.append(worker)
        return worker

    yield factory
    for worker in started:
        worker.stop()


@pytest.fixture(scope="session")
def spec_worker(prepared_models: tuple[Path, Path]) -> Iterator[WorkerProcess]:
    model, draft = prepared_models
    worker = start_worker(worker_command(model, "speculative", "--draft-model", str(draft)))
    yield worker
    worker.stop()


@pytest.fixture(scope="session")
def batch_worker(prepared_models: tuple[Path, Path]) -> Iterator[WorkerProcess]:
    model, _ = prepared_models
    worker = start_worker(worker_command(model, "batching", "--max-batch-size", str(BATCH_SIZE)))
    yield worker
    worker.stop()
