"""During the grace period the listener stays open: new requests get a 503 in the OpenAI
shape (code ``shutting_down``), not a refused connection; a second signal ends the grace
period at once (``speclane serve`` as a real subprocess)."""

from __future__ import annotations

import asyncio
import signal
from pathlib import Path

import aiohttp

from tests.conftest import fake_upstreams
from tests.fakes.upstream import Behaviour
from tests.reliability.harness import (
    RouterProcess,
    assert_openai_error,
    chat_body,
    config_text,
    eventually,
    read_stream,
)

GRACE = 120.0  # far longer than the test may take: only the second signal can end it


async def test_new_requests_get_503_during_the_grace_and_a_second_signal_ends_it(
    tmp_path: Path,
) -> None:
    async with fake_upstreams("slow") as (slow,):
        slow.behaviour = Behaviour(chunks=100_000, interval=0.05)  # cannot finish
        (tmp_path / "policies").mkdir()
        config = tmp_path / "speclane.toml"
        config.write_text(
            config_text(
                policies_dir=str(tmp_path / "policies"),
                shutdown_grace=GRACE,
                log_level="info",
                backends=[{"name": "slow", "base_url": slow.base_url, "read_timeout": 10}],
            )
        )
        proc = await RouterProcess.start(config, "--no-lanes")
        try:
            url = f"{proc.base_url}/chat/completions"
            first = asyncio.Event()
            async with aiohttp.ClientSession() as s:
                stream = asyncio.create_task(read_stream(s, url, chat_body(stream=True), {}, first))
                await asyncio.wait_for(first.wait(), 30)
                proc.proc.send_signal(signal.SIGTERM)

                async def draining() -> bool:
                    return any("shutting down" in line for line in proc.stderr)

                await eventually(draining, 30, "the shutdown log line")
                async with aiohttp.ClientSession() as fresh:  # a new connection
                    async with fresh.post(url, json=chat_body()) as resp:
                        status, body = resp.status, await resp.json()
                assert status == 503
                assert assert_openai_error(body)["code"] == "shutting_down"
                assert not stream.done()  # the stream in flight still runs
                proc.proc.send_signal(signal.SIGINT)  # Ctrl-C again
                result = await asyncio.wait_for(stream, 30)
            code = await proc.exited(30)
        finally:
            await proc.stop(signal.SIGKILL)
    err = result.error_event()
    assert err is not None and err["code"] == "shutting_down", result.raw[-300:]
    assert code == 0, "".join(proc.stderr[-20:])
    assert any("second signal" in line for line in proc.stderr)
