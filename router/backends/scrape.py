"""Scrape cumulative speculative counters from backends that keep them, and difference them.

vLLM and llama.cpp (``--metrics``) export Prometheus counters at ``/metrics``; vllm-mlx
reports totals at ``GET /v1/status``. A counter that goes down means the backend
restarted: the new value is the delta, and the reset is logged and counted.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Mapping

import aiohttp
import orjson

from router.backends.base import Backend
from router.backends.pool import BackendPool
from router.config.kinds import KINDS, ScrapeFormat
from router.periodic import Periodic
from router.speculation.cumulative import (
    CounterDelta,
    CounterDiffer,
    CounterKey,
    CounterSample,
    parse_prometheus_spec,
    parse_vllm_mlx_status,
)

log = logging.getLogger("speclane.scrape")

Parse = Callable[[bytes], Mapping[CounterKey, CounterSample]]


def _prometheus(body: bytes) -> Mapping[CounterKey, CounterSample]:
    return parse_prometheus_spec(body.decode("utf-8", "replace"))


def _status(body: bytes) -> Mapping[CounterKey, CounterSample]:
    try:
        return parse_vllm_mlx_status(orjson.loads(body))
    except orjson.JSONDecodeError:
        return {}


FORMATS: dict[ScrapeFormat, Parse] = {"prometheus": _prometheus, "vllm_mlx_status": _status}
# The kinds scraped (router.config.kinds): path under the server root, and its parser.
SOURCES: dict[str, tuple[str, Parse]] = {
    name: (facts.scrape[0], FORMATS[facts.scrape[1]])
    for name, facts in KINDS.items()
    if facts.scrape is not None
}

OnDeltas = Callable[[Backend, list[CounterDelta]], None]


class CumulativeScraper:
    def __init__(
        self,
        pool: BackendPool,
        session: aiohttp.ClientSession,
        interval: float,
        on_deltas: OnDeltas,
    ) -> None:
        self._pool = pool
        self._session = session
        self._on_deltas = on_deltas
        self._differs: dict[str, CounterDiffer] = {}
        self._periodic = Periodic("speclane-scrape", self.scrape_all, interval)

    def targets(self) -> list[Backend]:
        return [b for b in self._pool if b.lane is None and b.kind in SOURCES]

    async def scrape(self, backend: Backend) -> None:
        path, parse = SOURCES[backend.kind]
        timeout = aiohttp.ClientTimeout(total=10, sock_connect=backend.connect_timeout)
        try:
            async with self._session.get(
                f"{backend.root_url}{path}", timeout=timeout, headers=backend.auth_headers()
            ) as resp:
                if resp.status != 200:
                    return  # e.g. llama.cpp without --metrics: per-response stats still work
                body = await resp.read()
        except (aiohttp.ClientError, TimeoutError) as e:
            log.debug("scraping %s failed: %s", backend.name, e)
            return
        differ = self._differs.setdefault(backend.name, CounterDiffer())
        deltas = differ.update({k._replace(source=backend.name): v for k, v in parse(body).items()})
        for d in deltas:
            if d.restarted:
                log.info("backend %s restarted (speculative counters went down)", backend.name)
        if deltas:
            self._on_deltas(backend, deltas)

    async def scrape_all(self) -> None:
        await asyncio.gather(*(self.scrape(b) for b in self.targets()))

    def start(self) -> None:
        if self.targets():
            self._periodic.start()

    async def stop(self) -> None:
        await self._periodic.stop()
