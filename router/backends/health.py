"""Health checks and model discovery for external backends: GET {base_url}/models.

Every OpenAI-compatible server we front (LM Studio, llama.cpp, Ollama, vLLM, mlx_lm.server,
vllm-mlx, SGLang) answers /v1/models, so one probe serves as both liveness check and
model discovery. speclane's own lanes are watched by the supervisor instead.
"""

from __future__ import annotations

import asyncio
import logging
from contextlib import suppress

import aiohttp
import orjson

from router.backends.base import Backend
from router.backends.pool import BackendPool
from router.metrics import Metrics

log = logging.getLogger("speclane.health")


async def probe(session: aiohttp.ClientSession, backend: Backend) -> frozenset[str]:
    timeout = aiohttp.ClientTimeout(total=backend.connect_timeout + 5,
                                    sock_connect=backend.connect_timeout)
    async with session.get(
        f"{backend.base_url}/models", headers=backend.auth_headers(), timeout=timeout
    ) as resp:
        body = await resp.read()
        if resp.status != 200:
            raise RuntimeError(f"GET /models answered {resp.status}")
    data = orjson.loads(body)
    items = data.get("data", []) if isinstance(data, dict) else []
    return frozenset(str(m["id"]) for m in items if isinstance(m, dict) and "id" in m)


async def check_once(session: aiohttp.ClientSession, backend: Backend, metrics: Metrics) -> None:
    try:
        models = await probe(session, backend)
    except (aiohttp.ClientError, TimeoutError, RuntimeError, orjson.JSONDecodeError, KeyError) as e:
        if backend.ready or backend.last_error is None:
            log.warning("backend %s is not ready: %s", backend.name, e or type(e).__name__)
        backend.probe_failed(str(e) or type(e).__name__)
    else:
        if not backend.ready:
            log.info("backend %s is ready (%d models)", backend.name, len(models))
        backend.probe_succeeded(models)
    metrics.backend_up.labels(backend.name).set(1 if backend.ready else 0)


class HealthMonitor:
    """Polls every external backend on an interval; ``first_round`` is set after one pass."""

    def __init__(self, pool: BackendPool, session: aiohttp.ClientSession, metrics: Metrics,
                 interval: float) -> None:
        self._pool = pool
        self._session = session
        self._metrics = metrics
        self._interval = interval
        self._task: asyncio.Task[None] | None = None
        self.first_round = asyncio.Event()

    async def check_all(self) -> None:
        backends = [b for b in self._pool if b.lane is None]
        await asyncio.gather(*(check_once(self._session, b, self._metrics) for b in backends))
        self.first_round.set()

    async def _run(self) -> None:
        while True:
            await self.check_all()
            await asyncio.sleep(self._interval)

    async def start(self, wait: float) -> None:
        """Start polling; return when the first round is done or after ``wait`` seconds.

        Waiting lets /v1/models and routing work from the first request for the backends
        that answer at once; the bound keeps one that accepts connections but never answers
        from holding up start-up for its whole probe timeout. Its probe goes on, and it
        stays not ready until it answers.
        """
        self._task = asyncio.create_task(self._run(), name="speclane-health")
        first = asyncio.ensure_future(self.first_round.wait())
        try:
            await asyncio.wait({first, self._task}, timeout=wait,
                               return_when=asyncio.FIRST_COMPLETED)
        finally:
            first.cancel()
        if self._task.done():
            self._task.result()  # a bug in the probing: fail start-up loudly, as before
        if not self.first_round.is_set():
            waiting = [b.name for b in self._pool if b.lane is None and not b.ready
                       and b.last_error is None]
            log.warning("not waiting longer than %gs for the first health check of %s: "
                        "not ready until it answers", wait, ", ".join(waiting) or "a backend")

    async def stop(self) -> None:
        if self._task:
            self._task.cancel()
            with suppress(asyncio.CancelledError):
                await self._task
