"""Groups of real ranks on 127.0.0.1 (``mlx.launch --backend ring``) for the realmodel tests,
and the tiny model they load in seconds."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

import psutil
import pytest

from router.kernel.worker_contract import READY_PREFIX
from router.lanes.blas import preload_env
from router.lanes.modelprep import ensure_default_models
from router.lanes.rankgroup import free_port_range, launcher
from tests.worker.conftest import read_line
from tests.worker.group.tiny import make_tiny_model

READY_TIMEOUT = 300.0  # ranks load while sharing 2 busy cores


@pytest.fixture(scope="session")
def tiny_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    target, _ = ensure_default_models(quiet=True)
    return make_tiny_model(tmp_path_factory.mktemp("tiny") / "tiny", target, seed=0)


@pytest.fixture(scope="session")
def tiny_pipeline_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny ministral3: mlx-lm gives it ``pipeline()``."""
    target, _ = ensure_default_models(quiet=True)
    return make_tiny_model(tmp_path_factory.mktemp("tiny") / "tiny-pipe", target, pipeline=True)


@pytest.fixture(scope="session")
def tiny_draft(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Another random tiny model on the same vocabulary: a draft that is often wrong."""
    target, _ = ensure_default_models(quiet=True)
    return make_tiny_model(tmp_path_factory.mktemp("tiny") / "tiny-draft", target, seed=1)


def group_command(
    ranks: int, *worker_args: str, parallel: str = "tensor", mode: str = "speculative"
) -> list[str]:
    return [
        *launcher(sys.executable),
        "--backend",
        "ring",
        "--hosts",
        ",".join(["127.0.0.1"] * ranks),
        "--starting-port",
        str(free_port_range(ranks)),
        "--",
        sys.executable,
        "-m",
        "router.worker",
        "--mode",
        mode,
        *worker_args,
        "--group-parallel",
        parallel,
        "--group-hosts",
        ",".join(["127.0.0.1"] * ranks),
    ]


@dataclass
class Group:
    proc: subprocess.Popen[str]
    ready: dict[str, Any]
    stderr: IO[str]

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.ready['port']}"

    def ranks(self) -> list[psutil.Process]:
        """The rank processes (children of the launcher), rank order unknown."""
        return [
            p
            for p in psutil.Process(self.proc.pid).children(recursive=True)
            if "router.worker" in p.cmdline()
        ]

    def stderr_tail(self) -> str:
        self.stderr.seek(0)
        return "".join(self.stderr.readlines()[-30:])

    def stop(self) -> None:
        """SIGTERM to the launcher's process group (as the supervisor does), then SIGKILL."""
        members = [psutil.Process(self.proc.pid), *self.ranks()] if self.proc.poll() is None else []
        with_group(self.proc.pid, signal.SIGTERM)
        _, alive = psutil.wait_procs(members, timeout=20)
        if alive:
            with_group(self.proc.pid, signal.SIGKILL)
            psutil.wait_procs(alive, timeout=10)
        self.proc.wait(10)


def with_group(pgid: int, sig: signal.Signals) -> None:
    try:
        os.killpg(pgid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def start_group(
    ranks: int, *worker_args: str, parallel: str = "tensor", mode: str = "speculative"
) -> Group:
    stderr = tempfile.TemporaryFile("w+")
    proc = subprocess.Popen(
        group_command(ranks, *worker_args, parallel=parallel, mode=mode),
        stdout=subprocess.PIPE,
        stderr=stderr,
        text=True,
        env={**preload_env(), "PYTHONUNBUFFERED": "1"},
        start_new_session=True,
    )
    assert proc.stdout is not None
    line = read_line(proc.stdout, READY_TIMEOUT)
    if not line.startswith(READY_PREFIX):
        group = Group(proc, {}, stderr)
        group.stop()
        pytest.fail(f"group not ready (stdout {line!r}); stderr:\n{group.stderr_tail()}")
    return Group(proc, json.loads(line[len(READY_PREFIX) :]), stderr)


@pytest.fixture
def group_factory() -> Iterator[Any]:
    started: list[Group] = []

    def factory(ranks: int, *worker_args: str) -> Group:
        group = start_group(ranks, *worker_args)
        started.append(group)
        return group

    yield factory
    for group in started:
        group.stop()


def post(url: str, body: dict[str, Any], path: str = "/v1/completions") -> dict[str, Any]:
    """A worker's JSON answer to ``body`` (rank 0's, or a single process's)."""
    request = urllib.request.Request(
        url + path, json.dumps(body).encode(), {"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(request, timeout=300) as r:
        return json.loads(r.read())


def health(url: str) -> dict[str, Any]:
    with urllib.request.urlopen(url + "/health", timeout=10) as r:
        return json.loads(r.read())
