"""Start a router with its two MLX lanes for the scorecard, in a temporary configuration.

The configuration keeps the router's defaults except for what the bench must control:
loopback on a free port, the lanes' model/draft flags, a batch size that fits the highest
concurrency level, and a policies directory of its own:

- ``default.toml``: the permissive default (lane overrides allowed, no concurrency limit),
  which the ``auto`` scenario uses: the router's ordinary routing and auto-disable;
- ``speclane-bench.toml``: the client the forced scenarios identify as
  (``X-Speclane-Client: speclane-bench``), with the speculative auto-disable off, so that
  "speculation on" stays on for the whole run however it performs.

The router's log goes to ``router.log`` in the output directory.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import sys
import tempfile
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import IO

from router.bench import procs
from router.bench.matrix import BENCH_CLIENT

READY_LINE = r"speclane listening on (http://\S+)"
# The first start may prepare the default model (a ~93 MB wheel, converted locally).
START_DEADLINE = 1200.0

POLICIES = {
    "default.toml": (
        "# speclane bench: the permissive default (the `auto` scenario).\n"
        'client = "default"\n'
        "allow_lane_override = true\n"
    ),
    f"{BENCH_CLIENT}.toml": (
        "# speclane bench: the forced scenarios. Speculation stays as the lane header asks.\n"
        f'client = "{BENCH_CLIENT}"\n'
        "allow_lane_override = true\n"
        "[match]\n"
        f'client_header = ["{BENCH_CLIENT}"]\n'
        "[spec]\n"
        "enabled = false\n"
    ),
}


@dataclass(frozen=True)
class LaneOptions:
    model: str | None = None
    draft_model: str | None = None
    num_draft_tokens: int | None = None
    max_batch_size: int = 8


def write_policies(directory: Path) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    for name, text in POLICIES.items():
        (directory / name).write_text(text, encoding="utf-8")
    return directory


def config_text(policies_dir: Path, lanes: LaneOptions) -> str:
    def q(value: str) -> str:
        return json.dumps(value)  # a JSON string is a valid TOML basic string

    lines = [
        f"policies_dir = {q(str(policies_dir))}",
        'log_level = "info"',
        "shutdown_grace = 2",
        "[lanes]",
        f"max_batch_size = {lanes.max_batch_size}",
    ]
    if lanes.model:
        lines.append(f"model = {q(lanes.model)}")
    if lanes.draft_model:
        lines.append(f"draft_model = {q(lanes.draft_model)}")
    if lanes.num_draft_tokens is not None:
        lines.append(f"num_draft_tokens = {lanes.num_draft_tokens}")
    return "\n".join(lines) + "\n"


def router_env() -> dict[str, str]:
    """This environment without ``SPECLANE_*`` settings overrides (the temporary file must
    be what runs); process-level switches such as SPECLANE_HOME stay."""
    from router.config.settings import Settings

    fields = {name.lower() for name in Settings.model_fields}
    env = {}
    for key, value in os.environ.items():
        if key.startswith("SPECLANE_"):
            first = key[len("SPECLANE_"):].lower().split("__", 1)[0]
            if first in fields:
                continue
        env[key] = value
    return env


def _open_log(path: Path) -> IO[bytes]:
    # Truncated per run: the log sits next to the scorecard it explains, and
    # that scorecard is rewritten by every run, not appended to.
    return path.open("wb")


@contextlib.asynccontextmanager
async def own_router(lanes: LaneOptions, log_path: Path) -> AsyncIterator[str]:
    """A running router with both lanes; yields its base URL (``.../v1``)."""
    with tempfile.TemporaryDirectory(prefix="speclane-bench-") as tmp:
        config = Path(tmp) / "speclane.toml"
        config.write_text(config_text(write_policies(Path(tmp) / "policies"), lanes),
                          encoding="utf-8")
        with _open_log(log_path) as log:
            proc, match = await procs.spawn_until_line(
                [sys.executable, "-m", "router", "serve", "--config", str(config),
                 "--port", "0"],
                READY_LINE, deadline=START_DEADLINE, env=router_env(), stderr=log)
            drainer = asyncio.create_task(procs.drain(proc.stdout, log))
            try:
                yield match.group(1)
            finally:
                await procs.stop_group(proc)
                drainer.cancel()
