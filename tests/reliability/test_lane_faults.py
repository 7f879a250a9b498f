"""A lane worker that crashes or hangs, seen from the client side of the router.

tests/lanes/test_supervisor.py proves the supervisor restarts a crashed or hung worker; here the
supervised worker (tests/fakes/fake_worker.py, a real subprocess) is the speculative lane
of a running router, wired the way ``router.lanes.group`` wires a real one, and the test
checks what clients see meanwhile: every request is answered, by the batching lane while
the speculative one is down, and by the speculative lane again once it is back. No worker
process may outlive the test.
"""

from __future__ import annotations

import os
import signal
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import aiohttp

from router.lanes.group import apply_status, lane_backend
from router.lanes.supervisor import LaneState, LaneStatus, LaneSupervisor, WorkerCommand
from tests.conftest import RunningRouter, add_fake_lane, fake_upstreams, router_settings, run_router
from tests.fakes.lane_status import Recorder
from tests.fakes.upstream import FakeUpstream
from tests.reliability.harness import TALLY, chat_body, post_stream

FAKE_WORKER = Path(__file__).parents[1] / "fakes" / "fake_worker.py"
WAIT = 30.0
SLOW_START = 1.0  # keeps a restarted lane down long enough to see where traffic goes


@asynccontextmanager
async def supervised_lane(
    *flags: str,
) -> AsyncIterator[tuple[RunningRouter, LaneSupervisor, Recorder, FakeUpstream]]:
    """A router whose speculative lane is a supervised fake worker; batching is a fake."""
    async with fake_upstreams("batch") as (batch,):
        # Cache affinity off: these tests send one conversation again and again, and follow
        # where the lanes' health (not a cached prefix) sends it.
        settings = router_settings(
            backends=[],
            cooldown={"allowed_fails": 1, "seconds": 1},
            routing={"cache_affinity": False},
        )
        spec = lane_backend("speculative", settings, "fake-model")
        watch = Recorder(WAIT)

        def setup(wired):  # type: ignore[no-untyped-def]
            wired.services.pool.add(spec)
            add_fake_lane(wired, "batching", batch)

        async with run_router(settings, setup=setup) as r:
            metrics = r.services.metrics

            def on_change(status: LaneStatus) -> None:
                apply_status(spec, status, metrics)
                watch(status)

            argv = (
                sys.executable,
                str(FAKE_WORKER),
                "--mode",
                "speculative",
                "--model",
                "fake-model",
                "--draft-model",
                "fake-draft",
                "--port",
                "0",
                "--parent-pid",
                str(os.getpid()),
                "--slow-start",
                str(SLOW_START),
                *flags,
            )
            command = WorkerCommand("speculative", argv, {**os.environ, "PYTHONUNBUFFERED": "1"})
            sup = LaneSupervisor(
                command,
                startup_timeout=WAIT,
                health_interval=0.1,
                health_timeout=0.3,
                unhealthy_after=3,
                kill_grace=1.0,
                backoff_initial=0.05,
                backoff_max=0.2,
                max_restarts=20,
                metrics=metrics,
                on_change=on_change,
            )
            try:
                await sup.start()
                assert r.services.settings.lanes.enabled is False  # only our supervisor runs
                yield r, sup, watch, batch
            finally:
                await sup.stop(grace=1.0)
        assert watch.survivors() == [], "a worker process outlived its supervisor"


async def lane_of(s: aiohttp.ClientSession, r: RunningRouter, stream: bool = False) -> str:
    res = await post_stream(s, f"{r.base_url}/chat/completions", chat_body(stream=stream))
    assert res.status == 200, res.raw[:300]
    if stream:
        assert res.completed()
    return res.headers["X-Speclane-Lane"]


async def test_crashed_lane_worker_is_restarted_and_traffic_moves_meanwhile() -> None:
    async with supervised_lane() as (r, sup, watch, _), aiohttp.ClientSession() as s:
        assert await lane_of(s, r) == "speculative"
        victim = sup.status.pid
        assert victim is not None
        os.kill(victim, signal.SIGKILL)
        # Straight after the crash, before or after the supervisor noticed: still answered.
        assert await lane_of(s, r, stream=True) in ("speculative", "batching")
        await watch.wait_for(LaneState.DOWN, 1)
        served_meanwhile = [await lane_of(s, r, stream=i % 2 == 0) for i in range(4)]
        assert served_meanwhile == ["batching"] * 4
        back = await watch.wait_for(LaneState.READY, 2)
        assert back.pid not in (None, victim)
        assert victim in watch.procs and victim not in watch.survivors()
        assert await lane_of(s, r) == "speculative"
        restarts = r.services.metrics.registry.get_sample_value(
            "speclane_worker_restarts_total", {"lane": "speculative", "reason": "exited"}
        )
        assert restarts == 1
    TALLY.fault("lane_worker_crash")


async def test_hung_lane_worker_is_killed_restarted_and_traffic_moves_meanwhile() -> None:
    # /health stops answering after 4 answers: alive, listening, but hung.
    async with (
        supervised_lane("--hang-health-after", "4") as (r, sup, watch, batch),
        aiohttp.ClientSession() as s,
    ):
        first = sup.status.pid
        down = await watch.wait_for(LaneState.DOWN, 1)
        assert "hung" in (down.last_error or "")
        # While the lane is down every request goes to the batching lane, and is answered.
        assert [await lane_of(s, r, stream=True) for _ in range(3)] == ["batching"] * 3
        back = await watch.wait_for(LaneState.READY, 2)
        assert back.pid not in (None, first)
        assert first in watch.procs and first not in watch.survivors()  # killed, not left
        restarts = r.services.metrics.registry.get_sample_value(
            "speclane_worker_restarts_total", {"lane": "speculative", "reason": "hung"}
        )
        assert restarts and restarts >= 1
    assert len(batch.requests) >= 3
    TALLY.fault("lane_worker_hang")
