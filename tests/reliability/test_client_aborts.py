"""Clients that leave: mid-stream, while queued, mid-retry; and drain-on-abort per backend.

Each test observes the stop at the fake upstream (its request is cancelled, or for a
``drain_on_abort`` backend, finished instead) and checks that every counter returns to zero:
the backend's in-flight count, the ``speclane_inflight_requests`` and ``speclane_queue_depth``
gauges and the client's concurrency slots. tests/proxy/test_relay.py has the single-stream case;
here many streams leave at once and the counters are read back through /metrics.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import aiohttp

from tests.conftest import fake_upstreams, router_settings, run_router, wait_until
from tests.fakes.upstream import Behaviour, FakeUpstream
from tests.reliability.harness import TALLY, chat_body, eventually, metric_total, post_stream


async def counters_at_zero(s: aiohttp.ClientSession, url: str) -> None:
    assert await metric_total(s, url, "speclane_inflight_requests") == 0
    assert await metric_total(s, url, "speclane_queue_depth") == 0


async def leave_after_first_chunk(url: str, body: dict, left: asyncio.Event) -> None:
    async with aiohttp.ClientSession() as s, s.post(url, json=body) as resp:
        assert resp.status == 200
        await resp.content.readany()
    left.set()  # the session is closed: the connection is gone


async def test_many_clients_leaving_mid_stream_stop_every_upstream_request(
    fake: FakeUpstream,
) -> None:
    fake.behaviour = Behaviour(chunks=10_000, interval=0.01)
    clients = 16
    async with run_router(router_settings(fake)) as r:
        url = f"{r.base_url}/chat/completions"
        events = [asyncio.Event() for _ in range(clients)]
        await asyncio.gather(
            *(leave_after_first_chunk(url, chat_body(stream=True), e) for e in events)
        )
        await wait_until(lambda: fake.cancelled == clients, deadline=10)
        await wait_until(lambda: r.services.pool["fake"].inflight == 0)
        async with aiohttp.ClientSession() as s:
            await counters_at_zero(s, r.url)
            gone = await metric_total(s, r.url, "speclane_client_disconnects_total")
            assert gone == clients
    assert not any(q.finished for q in fake.requests)
    TALLY.fault("client_gone_mid_stream", clients)


QUEUED_POLICY = 'client = "default"\nmax_concurrency = 1\nqueue_timeout = 30\n'


async def test_client_leaving_while_queued_frees_its_place_and_never_reaches_upstream(
    tmp_path: Path, fake: FakeUpstream
) -> None:
    (tmp_path / "default.toml").write_text(QUEUED_POLICY)
    fake.behaviour = Behaviour(chunks=10_000, interval=0.01)
    async with run_router(router_settings(fake, policies_dir=str(tmp_path))) as r:
        url = f"{r.base_url}/chat/completions"
        limiter = r.services.limiter
        holder_session = aiohttp.ClientSession()
        holder = await holder_session.post(url, json=chat_body(stream=True))
        await holder.content.readany()  # the only slot is taken
        queued_session = aiohttp.ClientSession()
        queued = asyncio.create_task(post_stream(queued_session, url, chat_body()))
        await wait_until(lambda: limiter.queued("default") == 1)
        queued.cancel()  # the queued client leaves
        await asyncio.gather(queued, return_exceptions=True)
        await queued_session.close()
        await wait_until(lambda: limiter.queued("default") == 0)
        assert limiter.active("default") == 1 and len(fake.requests) == 1
        holder.close()  # now the slot holder leaves mid-stream
        await holder_session.close()
        await asyncio.wait_for(fake.request_cancelled.wait(), 5)
        await wait_until(lambda: limiter.active("default") == 0)
        async with aiohttp.ClientSession() as s:
            await counters_at_zero(s, r.url)
            fake.behaviour = Behaviour()
            res = await post_stream(s, url, chat_body())  # the slot was not leaked
            assert res.status == 200
            assert float(res.headers["X-Speclane-Queue-Ms"]) < 100
    assert len(fake.requests) == 2  # holder, then the last request: never the queued one
    TALLY.fault("client_gone_mid_queue")
    TALLY.fault("client_gone_mid_stream")


async def test_client_leaving_mid_retry_stops_the_retry_upstream() -> None:
    async with fake_upstreams("a", "b") as (a, b):
        a.behaviour = Behaviour(status=503)  # the first attempt fails: retried on b
        b.behaviour = Behaviour(delay_headers=30)  # the retry is then in progress
        async with run_router(router_settings(a, b)) as r:
            session = aiohttp.ClientSession()
            call = asyncio.create_task(
                session.post(f"{r.base_url}/chat/completions", json=chat_body())
            )
            await asyncio.wait_for(b.request_started.wait(), 10)
            assert len(a.requests) == 1  # the first attempt happened on a
            call.cancel()
            await asyncio.gather(call, return_exceptions=True)
            await session.close()
            await asyncio.wait_for(b.request_cancelled.wait(), 5)
            async with aiohttp.ClientSession() as s:

                async def recorded() -> bool:
                    return (
                        await metric_total(s, r.url, "speclane_requests_total", status="499") == 1
                    )

                await eventually(recorded, what="499 recorded")  # no attempt is left
                await counters_at_zero(s, r.url)
            assert len(a.requests) == 1 and len(b.requests) == 1
            assert all(x.inflight == 0 for x in r.services.pool)
    TALLY.fault("client_gone_mid_retry")


# --- drain_on_abort ---------------------------------------------------------------------------


def drain_settings(fake: FakeUpstream, drain: bool):  # type: ignore[no-untyped-def]
    return router_settings(
        backends=[
            {
                "name": fake.name,
                "base_url": fake.base_url,
                "drain_on_abort": drain,
                "read_timeout": 10,
            }
        ]
    )


async def test_drain_on_abort_lets_an_abandoned_stream_finish_upstream(fake: FakeUpstream) -> None:
    fake.behaviour = Behaviour(chunks=30, interval=0.02)
    async with run_router(drain_settings(fake, drain=True)) as r:
        await leave_after_first_chunk(
            f"{r.base_url}/chat/completions", chat_body(stream=True), asyncio.Event()
        )
        await wait_until(lambda: r.services.pool["fake"].inflight == 0)  # at once, for routing
        await wait_until(lambda: fake.requests[0].finished, deadline=10)
        await wait_until(lambda: not r.services.relay._drains)  # nothing kept after the drain
    assert fake.cancelled == 0
    TALLY.fault("client_gone_drain_on_abort")


async def test_drain_on_abort_also_covers_a_client_leaving_before_the_answer_starts(
    fake: FakeUpstream,
) -> None:
    """A backend that crashes on aborts must not see one while it is still prefilling."""
    fake.behaviour = Behaviour(delay_headers=0.5, chunks=3)
    async with run_router(drain_settings(fake, drain=True)) as r:
        for stream in (False, True):
            fake.request_started.clear()
            session = aiohttp.ClientSession()
            call = asyncio.create_task(
                session.post(f"{r.base_url}/chat/completions", json=chat_body(stream=stream))
            )
            await asyncio.wait_for(fake.request_started.wait(), 10)
            call.cancel()
            await asyncio.gather(call, return_exceptions=True)
            await session.close()
        await wait_until(
            lambda: len(fake.requests) == 2 and all(q.finished for q in fake.requests), deadline=10
        )
        await wait_until(lambda: not r.services.relay._drains)
        assert r.services.pool["fake"].inflight == 0
    assert fake.cancelled == 0
    TALLY.fault("client_gone_drain_on_abort", 2)


async def test_without_drain_on_abort_a_client_leaving_early_cancels_upstream(
    fake: FakeUpstream,
) -> None:
    fake.behaviour = Behaviour(delay_headers=30)
    async with run_router(drain_settings(fake, drain=False)) as r:
        session = aiohttp.ClientSession()
        call = asyncio.create_task(
            session.post(f"{r.base_url}/chat/completions", json=chat_body(stream=True))
        )
        await asyncio.wait_for(fake.request_started.wait(), 10)
        call.cancel()
        await asyncio.gather(call, return_exceptions=True)
        await session.close()
        await asyncio.wait_for(fake.request_cancelled.wait(), 5)
        assert not r.services.relay._drains
    TALLY.fault("client_gone_before_answer")
