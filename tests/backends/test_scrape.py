"""Cumulative counters scraped from a real loopback server shaped like vLLM's /metrics."""

from __future__ import annotations

import aiohttp
from aiohttp import web

from router.backends.base import Backend
from router.backends.cooldown import Cooldown
from router.backends.pool import BackendPool
from router.backends.scrape import CumulativeScraper
from router.speculation.cumulative import CounterDelta

VLLM_METRICS = """# HELP vllm:spec_decode_num_drafts_total Number of spec decoding drafts.
# TYPE vllm:spec_decode_num_drafts_total counter
vllm:spec_decode_num_drafts_total{{engine="0",model_name="qwen"}} {drafts}
# TYPE vllm:spec_decode_num_draft_tokens_total counter
vllm:spec_decode_num_draft_tokens_total{{engine="0",model_name="qwen"}} {drafted}
# TYPE vllm:spec_decode_num_accepted_tokens_total counter
vllm:spec_decode_num_accepted_tokens_total{{engine="0",model_name="qwen"}} {accepted}
"""


async def test_scrapes_difference_and_detect_a_restart() -> None:
    totals = iter([(10, 30, 20), (14, 42, 26), (2, 6, 3)])  # the third: a restarted server

    async def metrics(request: web.Request) -> web.Response:
        drafts, drafted, accepted = next(totals)
        return web.Response(
            text=VLLM_METRICS.format(drafts=drafts, drafted=drafted, accepted=accepted)
        )

    app = web.Application()
    app.router.add_get("/metrics", metrics)
    runner = web.AppRunner(app)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", 0).start()
    port = runner.addresses[0][1]
    backend = Backend(
        name="vllm", kind="vllm", base_url=f"http://127.0.0.1:{port}/v1", cooldown=Cooldown(3, 5)
    )
    seen: list[CounterDelta] = []
    try:
        async with aiohttp.ClientSession() as session:
            scraper = CumulativeScraper(
                BackendPool([backend]), session, 60, lambda b, deltas: seen.extend(deltas)
            )
            for _ in range(3):
                await scraper.scrape(backend)
    finally:
        await runner.cleanup()
    first, second = seen  # the first scrape only sets the baseline
    assert (first.result.drafted, first.result.accepted, first.restarted) == (12, 6, False)
    assert (second.result.drafted, second.result.accepted, second.restarted) == (6, 3, True)
    assert first.key.source == "vllm" and first.key.model == "qwen"
