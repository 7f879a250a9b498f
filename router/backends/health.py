"""Health checks and model discovery for external backends.

Readiness asks what each server offers to say it is up: ``GET {root}/health`` for
``mlx_lm.server``, whose ``/v1/models`` lists the Hugging Face cache and answers 200 with an
empty body on a machine without one (mlx-lm 0.32.2, captured in
tests/fixtures/real-backends); ``GET {base_url}/models`` for the others (LM Studio,
llama.cpp, Ollama, vLLM, vllm-mlx, SGLang), where it is both liveness check and model
discovery. Model discovery never decides readiness: a 200 whose body is empty or not a
model list is a live server with no models listed, and a backend with configured
``models = [...]`` is ready on liveness alone. speclane's own lanes are watched by the
supervisor instead.
"""

from __future__ import annotations

import asyncio
import logging

import aiohttp
import orjson

from router.backends.base import Backend
from router.backends.pool import BackendPool
from router.config.kinds import KINDS
from router.metrics import Metrics
from router.periodic import Periodic

log = logging.getLogger("speclane.health")

MAX_MODELS_BODY = 4 * 1024 * 1024  # a model list bigger than this is not one


class NotReady(Exception):
    """The server answered, but not that it is up."""


def _timeout(backend: Backend) -> aiohttp.ClientTimeout:
    return aiohttp.ClientTimeout(
        total=backend.connect_timeout + 5, sock_connect=backend.connect_timeout
    )


async def _get(session: aiohttp.ClientSession, backend: Backend, url: str) -> bytes:
    async with session.get(url, headers=backend.auth_headers(), timeout=_timeout(backend)) as resp:
        if resp.status != 200:
            raise NotReady(f"GET {url.removeprefix(backend.root_url)} answered {resp.status}")
        body = bytearray()
        async for chunk in resp.content.iter_chunked(64 * 1024):
            body += chunk
            if len(body) > MAX_MODELS_BODY:
                break  # too big to be a model list: model_ids() reads it as none
    return bytes(body)


def model_ids(body: bytes) -> frozenset[str]:
    """The ids of an OpenAI model list; none for an empty or malformed body (pure)."""
    if not body.strip() or len(body) > MAX_MODELS_BODY:
        return frozenset()
    try:
        data = orjson.loads(body)
    except orjson.JSONDecodeError:
        return frozenset()
    items = data.get("data") if isinstance(data, dict) else None
    if not isinstance(items, list):
        return frozenset()
    return frozenset(
        m["id"] for m in items if isinstance(m, dict) and isinstance(m.get("id"), str) and m["id"]
    )


async def probe(session: aiohttp.ClientSession, backend: Backend) -> frozenset[str]:
    """Raise unless the backend is up; the models it lists (maybe none)."""
    facts = KINDS.get(backend.kind)
    liveness = facts.liveness_path if facts is not None else None  # None: the model list
    if liveness is None:
        return model_ids(await _get(session, backend, f"{backend.base_url}/models"))
    await _get(session, backend, f"{backend.root_url}{liveness}")
    if backend.configured_models:
        return frozenset()  # the list is not needed, and may be empty (see the module doc)
    try:
        return model_ids(await _get(session, backend, f"{backend.base_url}/models"))
    except (aiohttp.ClientError, TimeoutError, NotReady) as e:
        log.debug("backend %s lists no models: %s", backend.name, e)
        return frozenset()


async def check_once(session: aiohttp.ClientSession, backend: Backend, metrics: Metrics) -> None:
    try:
        models = await probe(session, backend)
    except (aiohttp.ClientError, TimeoutError, NotReady) as e:
        if backend.ready or backend.last_error is None:
            log.warning("backend %s is not ready: %s", backend.name, e or type(e).__name__)
        backend.probe_failed(str(e) or type(e).__name__)
    else:
        if not backend.ready:
            if backend.configured_models or models:
                log.info(
                    "backend %s is ready (%d models %s)",
                    backend.name,
                    len(backend.configured_models or models),
                    "configured" if backend.configured_models else "listed",
                )
            else:
                log.warning(
                    "backend %s is up but lists no models: set models = [...] in its "
                    "configuration to route to it",
                    backend.name,
                )
        backend.probe_succeeded(models)
    metrics.backend_up.labels(backend.name).set(1 if backend.ready else 0)


class HealthMonitor:
    """Polls every external backend on an interval; ``first_round`` is set after one pass."""

    def __init__(
        self, pool: BackendPool, session: aiohttp.ClientSession, metrics: Metrics, interval: float
    ) -> None:
        self._pool = pool
        self._session = session
        self._metrics = metrics
        self._periodic = Periodic("speclane-health", self.check_all, interval)
        self.first_round = asyncio.Event()

    async def check_all(self) -> None:
        backends = [b for b in self._pool if b.lane is None]
        await asyncio.gather(*(check_once(self._session, b, self._metrics) for b in backends))
        self.first_round.set()

    async def start(self, wait: float) -> None:
        """Start polling; return when the first round is done or after ``wait`` seconds.

        Waiting lets /v1/models and routing work from the first request for the backends
        that answer at once; the bound keeps one that accepts connections but never answers
        from holding up start-up for its whole probe timeout. Its probe goes on, and it
        stays not ready until it answers.
        """
        task = self._periodic.start()
        first = asyncio.ensure_future(self.first_round.wait())
        try:
            await asyncio.wait({first, task}, timeout=wait, return_when=asyncio.FIRST_COMPLETED)
        finally:
            first.cancel()
        if task.done():
            task.result()  # a bug in the probing: fail start-up loudly, as before
        if not self.first_round.is_set():
            waiting = [
                b.name
                for b in self._pool
                if b.lane is None and not b.ready and b.last_error is None
            ]
            log.warning(
                "not waiting longer than %gs for the first health check of %s: "
                "not ready until it answers",
                wait,
                ", ".join(waiting) or "a backend",
            )

    async def stop(self) -> None:
        await self._periodic.stop()
