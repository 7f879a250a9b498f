"""The router stopping with requests in flight: each finishes or ends with an error event.

``speclane serve`` is a real subprocess here, stopped with SIGTERM while 50 streams run
through it: those that can finish within ``shutdown_grace`` finish, the others end with an
error event and ``data: [DONE]``, nothing is cut silently, and the process exits 0 leaving
no child behind. The in-process test checks the same rules for every kind of request
(streams, answers not started yet, queued requests) through ``Relay.shutdown``.
"""

from __future__ import annotations

import asyncio
import signal
import time
from pathlib import Path

import aiohttp

from tests.conftest import fake_upstreams, router_settings, run_router
from tests.fakes.upstream import Behaviour
from tests.reliability.harness import (
    TALLY,
    RouterProcess,
    StreamResult,
    assert_openai_error,
    chat_body,
    config_text,
    read_stream,
)

GRACE = 3.0
SLACK = 4.0  # the settle time after the grace, plus scheduling on a loaded 2-core machine


async def stream_through(
    s: aiohttp.ClientSession, url: str, lane: str, first: asyncio.Event
) -> tuple[StreamResult, float]:
    """Read a whole stream; returns it with the monotonic time it ended."""
    result = await read_stream(s, url, chat_body(stream=True), {"X-Speclane-Lane": lane}, first)
    return result, time.monotonic()


def judge(res: StreamResult) -> str:
    """'finished', or 'error_event'; anything else fails the test."""
    assert res.status == 200 and res.terminated, (res.status, res.raw[-300:])
    if res.completed():
        return "finished"
    err = res.error_event()
    assert err is not None, f"stream ended without [DONE] or an error event: {res.raw[-300:]!r}"
    return "error_event"


async def test_sigterm_with_50_streams_in_flight(tmp_path: Path) -> None:
    per_kind = 25
    async with fake_upstreams("quick", "slow") as (quick, slow):
        quick.behaviour = Behaviour(chunks=20, interval=0.05)  # ~1 s: finishes within grace
        slow.behaviour = Behaviour(chunks=100_000, interval=0.05)  # cannot finish
        (tmp_path / "policies").mkdir()
        config = tmp_path / "speclane.toml"
        config.write_text(
            config_text(
                policies_dir=str(tmp_path / "policies"),
                shutdown_grace=GRACE,
                log_level="warning",
                backends=[
                    {"name": f.name, "base_url": f.base_url, "read_timeout": 10}
                    for f in (quick, slow)
                ],
            )
        )
        proc = await RouterProcess.start(config, "--no-lanes")
        try:
            url = f"{proc.base_url}/chat/completions"
            children_before = proc.ps.children(recursive=True)
            firsts = [asyncio.Event() for _ in range(2 * per_kind)]
            async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as s:
                tasks = [
                    asyncio.create_task(
                        stream_through(s, url, "quick" if i < per_kind else "slow", first)
                    )
                    for i, first in enumerate(firsts)
                ]
                await asyncio.wait_for(asyncio.gather(*(f.wait() for f in firsts)), 60)
                assert quick.active + slow.active == 2 * per_kind  # all 50 in flight
                sent = time.monotonic()
                proc.proc.send_signal(signal.SIGTERM)
                results = await asyncio.wait_for(asyncio.gather(*tasks), GRACE + 30)
            code = await proc.exited(GRACE + 30)  # a second SIGTERM would race the exit
            exited = time.monotonic() - sent
        finally:
            await proc.stop(signal.SIGKILL)
        verdicts = [judge(res) for res, _ in results]
        latest = max(ended for _, ended in results) - sent
        assert verdicts[:per_kind] == ["finished"] * per_kind
        assert verdicts[per_kind:] == ["error_event"] * per_kind
        for res, _ in results[per_kind:]:
            assert res.error_event()["code"] == "shutting_down"  # type: ignore[index]
        assert latest < GRACE + SLACK, latest
        assert code == 0, "".join(proc.stderr[-20:])
        assert exited < GRACE + SLACK + 5
        assert slow.cancelled == per_kind  # the upstream work was stopped
        survivors = [p.pid for p in children_before if p.is_running()]
        assert survivors == []
    TALLY.shutdown.update(
        streams=2 * per_kind,
        finished=verdicts.count("finished"),
        ended_with_error_event=verdicts.count("error_event"),
        lost=0,
        last_stream_end_s=round(latest, 2),
        exit_s=round(exited, 2),
        grace_s=GRACE,
    )
    TALLY.fault("sigterm_with_streams_in_flight", 2 * per_kind)


async def test_relay_shutdown_ends_every_kind_of_request_cleanly(tmp_path: Path) -> None:
    """In-process, with the hook registered by the test: finished, error event, 503."""
    (tmp_path / "default.toml").write_text(
        'client = "default"\nmax_concurrency = 3\nqueue_timeout = 60\n'
    )
    async with fake_upstreams("quick", "slow", "silent") as (quick, slow, silent):
        quick.behaviour = Behaviour(chunks=10, interval=0.05)
        slow.behaviour = Behaviour(chunks=100_000, interval=0.05)
        silent.behaviour = Behaviour(delay_headers=600)
        settings = router_settings(
            quick, slow, silent, shutdown_grace=1.0, policies_dir=str(tmp_path)
        )

        def hook(wired):  # type: ignore[no-untyped-def]
            async def finish(app):  # type: ignore[no-untyped-def]
                services = wired.services
                await services.relay.shutdown(services.settings.shutdown_grace)

            wired.app.on_shutdown.append(finish)

        s = aiohttp.ClientSession()
        try:
            async with run_router(settings, setup=hook) as r:
                url = f"{r.base_url}/chat/completions"
                firsts = [asyncio.Event() for _ in range(2)]
                streams = [
                    asyncio.create_task(stream_through(s, url, lane, first))
                    for lane, first in zip(("quick", "slow"), firsts, strict=True)
                ]
                silent_call = asyncio.create_task(
                    s.post(url, json=chat_body(), headers={"X-Speclane-Lane": "silent"})
                )
                queued_call = asyncio.create_task(
                    s.post(url, json=chat_body(), headers={"X-Speclane-Lane": "silent"})
                )
                await asyncio.wait_for(asyncio.gather(*(f.wait() for f in firsts)), 10)
                await asyncio.wait_for(silent.request_started.wait(), 10)
                started = time.monotonic()
            # run_router's exit is the shutdown (sites closed, on_shutdown, cleanup)
            took = time.monotonic() - started
            (quick_res, _), (slow_res, _) = await asyncio.gather(*streams)
            answers = [await asyncio.wait_for(c, 5) for c in (silent_call, queued_call)]
            bodies = [await a.json() for a in answers]
        finally:
            await s.close()
    assert judge(quick_res) == "finished"
    assert judge(slow_res) == "error_event"
    for answer, body in zip(answers, bodies, strict=True):
        assert answer.status == 503
        assert assert_openai_error(body)["code"] == "shutting_down"
    assert silent.cancelled >= 1 and slow.cancelled == 1
    assert took < 1.0 + SLACK
    TALLY.fault("shutdown_in_process", 4)
