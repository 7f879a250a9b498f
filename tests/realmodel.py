"""What the real-model tests share, each made once per session (``pytest -m realmodel``): the
prepared default models, the default model and draft loaded in this process, and a router
(``python -m router serve``) with both real lanes on the default configuration.

A test that only reads them uses these. A test that needs its own router, worker or model
(it kills one, configures it otherwise, or must start from an empty cache) starts it and
says why. A plugin of tests/conftest.py, so every test package sees the fixtures.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import openai
import psutil
import pytest

from router.lanes.blas import load_in_this_process
from router.lanes.modelprep import ensure_default_models

# MLX in this process (the engines, the model loaded here, the fast tier's tiny models) on
# OpenBLAS, as in the workers: the wheel's own BLAS is several times slower on a CPU.
load_in_this_process()


@pytest.fixture(scope="session")
def prepared_models() -> tuple[Path, Path]:
    """The default model and its draft, prepared once (``speclane models prepare``)."""
    return ensure_default_models(quiet=True)


@pytest.fixture(scope="session")
def loaded_models(prepared_models: tuple[Path, Path]) -> tuple[Any, Any, Any]:
    """(model, tokenizer, draft) in this process, loaded once. Every array they hold is
    evaluated here, as the shared worker does, so that engines on their own generation
    threads may use them (a lazy array cannot cross threads: router.worker.engines.shared)."""
    from mlx_lm import load

    from router.worker.engines.engine import Models
    from router.worker.engines.shared import materialize

    model, tokenizer = load(str(prepared_models[0]))
    draft, _ = load(str(prepared_models[1]))
    materialize(Models(model, tokenizer, draft))
    return model, tokenizer, draft


@dataclass
class Router:
    proc: subprocess.Popen[str]
    base_url: str
    output: list[str]
    grew: threading.Condition = field(default_factory=threading.Condition)  # a line came

    def wait_for_line(self, found: Callable[[list[str]], bool], timeout: float) -> bool:
        """Wait until ``found(output)`` holds (the router logs a request once it has ended:
        after its client may have seen the end)."""
        with self.grew:
            return self.grew.wait_for(lambda: found(self.output), timeout)

    def client(self, **kw: object) -> openai.OpenAI:
        return openai.OpenAI(
            base_url=self.base_url, api_key="local", max_retries=0, timeout=120, **kw
        )  # type: ignore[arg-type]

    def workers(self) -> dict[str, psutil.Process]:
        found = {}
        for child in psutil.Process(self.proc.pid).children(recursive=True):
            cmd = child.cmdline()
            if "router.worker" in cmd:
                found[cmd[cmd.index("--mode") + 1]] = child
        return found

    def metrics(self) -> str:
        import urllib.request

        with urllib.request.urlopen(self.base_url.removesuffix("/v1") + "/metrics") as resp:
            return resp.read().decode()


def start_router(tmp: Path, extra_config: str = "", flags: tuple[str, ...] = ()) -> Router:
    """``python -m router serve`` with both real lanes (``flags`` follow: ``--no-lanes``...);
    returns once it listens (its lanes are ready by then: start-up waits for them)."""
    ensure_default_models(quiet=True)
    (tmp / "policies").mkdir(exist_ok=True)
    config = tmp / "speclane.toml"
    config.write_text(
        f'policies_dir = "{tmp}/policies"\nshutdown_grace = 5\n'
        f"[lanes]\nhealth_interval = 0.5\nmax_batch_size = 4\n"
        # the run's own disk tier: entries of earlier runs (or of the user's router) unseen
        f'prompt_cache_dir = "{tmp}/prompt-cache"\n{extra_config}'
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith("SPECLANE_")}
    proc = subprocess.Popen(
        [sys.executable, "-m", "router", "serve", "--config", str(config), "--port", "0", *flags],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env=env,
    )
    output: list[str] = []
    grew = threading.Condition()
    ready = threading.Event()
    url: list[str] = []

    def pump() -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            with grew:
                output.append(line)
                grew.notify_all()
            if m := re.search(r"listening on (http://\S+)", line):
                url.append(m.group(1))
                ready.set()
        ready.set()

    threading.Thread(target=pump, daemon=True).start()
    ready.wait(300)
    if not url:
        proc.kill()
        raise AssertionError("router did not start:\n" + "".join(output[-40:]))
    return Router(proc, url[0], output, grew)


def stop_router(router: Router) -> None:
    if router.proc.poll() is None:
        router.proc.send_signal(signal.SIGTERM)
        try:
            router.proc.wait(60)
        except subprocess.TimeoutExpired:
            router.proc.kill()


@pytest.fixture(scope="session")
def real_lanes_router(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Router]:
    """One router with both real lanes, default configuration and no policies, for every
    test that only sends it requests and reads what it answers and counts (counters are
    read as differences: other tests' requests add to them)."""
    r = start_router(tmp_path_factory.mktemp("lanes"))
    yield r
    stop_router(r)
