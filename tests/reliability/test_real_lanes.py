"""SIGTERM with streams running on the two real MLX lanes: no worker process survives.

tests/lanes/test_lanes_e2e.py stops an idle router; here both lanes are generating when SIGTERM
arrives. The workers must all be gone after the router exits (0), and every stream must
have finished or ended with an error event (once router/app.py runs Relay.shutdown).
"""

from __future__ import annotations

import asyncio
import signal
import time
from pathlib import Path

import aiohttp
import psutil
import pytest

from router.lanes.modelprep import DEFAULT_MODEL_NAME, ensure_default_models
from tests.reliability.harness import (
    TALLY,
    RouterProcess,
    StreamResult,
    config_text,
    read_stream,
)
from tests.reliability.test_shutdown import judge

pytestmark = pytest.mark.realmodel

GRACE = 3.0


async def stream_on(
    s: aiohttp.ClientSession, url: str, lane: str, first: asyncio.Event
) -> tuple[StreamResult, float]:
    body = {
        "model": DEFAULT_MODEL_NAME,
        "stream": True,
        "max_tokens": 400,
        "temperature": 0,
        "messages": [{"role": "user", "content": "Count from 1 to 200."}],
    }
    result = await read_stream(s, url, body, {"X-Speclane-Lane": lane}, first)
    return result, time.monotonic()


async def test_sigterm_while_both_lanes_generate_leaves_no_worker(tmp_path: Path) -> None:
    await asyncio.to_thread(ensure_default_models, quiet=True)
    (tmp_path / "policies").mkdir()
    config = tmp_path / "speclane.toml"
    config.write_text(
        config_text(
            policies_dir=str(tmp_path / "policies"),
            shutdown_grace=GRACE,
            lanes={"health_interval": 0.5, "max_batch_size": 4},
        )
    )
    router = await RouterProcess.start(config, deadline=300)
    try:
        workers = [
            p
            for p in router.ps.children(recursive=True)
            if "router.worker" in " ".join(p.cmdline())
        ]
        assert len(workers) == 2, [p.cmdline() for p in workers]
        url = f"{router.base_url}/chat/completions"
        lanes = ["speculative", "batching", "batching"]
        firsts = [asyncio.Event() for _ in lanes]
        async with aiohttp.ClientSession() as s:
            tasks = [
                asyncio.create_task(stream_on(s, url, lane, first))
                for lane, first in zip(lanes, firsts, strict=True)
            ]
            await asyncio.wait_for(asyncio.gather(*(f.wait() for f in firsts)), 180)
            sent = time.monotonic()
            router.proc.send_signal(signal.SIGTERM)
            results = await asyncio.wait_for(asyncio.gather(*tasks), 2 * GRACE + 60)
        code = await router.exited(60)
    finally:
        await router.stop(signal.SIGKILL)
    _, alive = psutil.wait_procs(workers, timeout=20)
    assert not alive, f"workers survived SIGTERM: {[p.pid for p in alive]}"
    TALLY.fault("sigterm_real_lanes", len(lanes))
    assert code == 0, "".join(router.stderr[-30:])
    verdicts = [judge(res) for res, _ in results]
    # 400 tokens at ~10 tok/s cannot finish within 3 s (the prompt makes the default model
    # count, line by line, to max_tokens: "Count from one to one hundred" got a 15-token answer)
    assert "error_event" in verdicts, [(res.raw[-300:], end - sent) for res, end in results]
    assert max(end for _, end in results) - sent < GRACE + 4
