"""HTTP handlers: parse, decide, relay. Everything they raise is rendered by the middleware."""

from __future__ import annotations

import asyncio
import time

from aiohttp import web

from router import errors, lanes, observe
from router.appkeys import METRICS, POOL, RELAY, SETTINGS
from router.backends.base import Backend
from router.decision import Candidate, Decision, Endpoint
from router.errors import RouterError
from router.metrics import CONTENT_TYPE
from router.protocol import ParsedRequest, parse_request
from router.relay import Outcome

UPSTREAM_PATHS: dict[Endpoint, str] = {
    "chat": "/chat/completions",
    "completions": "/completions",
    "embeddings": "/embeddings",
}


def decide(request: web.Request, parsed: ParsedRequest) -> Decision:
    try:
        return lanes.choose(parsed.route, request.app[POOL].snapshot())
    except lanes.NoRoute as e:
        if e.unknown_model:
            raise errors.not_found(e.reason, param="model", code="model_not_found") from None
        raise errors.unavailable(e.reason) from None


def body_for(parsed: ParsedRequest):  # type: ignore[no-untyped-def]
    def build(backend: Backend, cand: Candidate) -> bytes:
        return parsed.body()

    return build


async def proxy(request: web.Request, endpoint: Endpoint) -> web.StreamResponse:
    arrival = time.monotonic()
    outcome = Outcome(endpoint=endpoint, arrival=arrival)
    metrics = request.app[METRICS]
    try:
        parsed = parse_request(endpoint, await request.read())
        decision = decide(request, parsed)
        overhead = time.monotonic() - arrival
        metrics.overhead.labels(endpoint).observe(overhead)
        headers = {"X-Speclane-Overhead-Ms": f"{overhead * 1000:.3f}"}
        return await request.app[RELAY].forward(
            request, parsed, decision, path=UPSTREAM_PATHS[endpoint], outcome=outcome,
            body_for=body_for(parsed), headers=headers)
    except RouterError as e:
        outcome.status, outcome.error = e.status, e
        raise
    except asyncio.CancelledError:
        outcome.client_gone = True
        raise
    finally:
        outcome.finished_at = time.monotonic()
        observe.record(metrics, outcome)


async def chat(request: web.Request) -> web.StreamResponse:
    return await proxy(request, "chat")


async def completions(request: web.Request) -> web.StreamResponse:
    return await proxy(request, "completions")


async def embeddings(request: web.Request) -> web.StreamResponse:
    return await proxy(request, "embeddings")


async def models(request: web.Request) -> web.Response:
    data = [{"id": m, "object": "model", "created": 0, "owned_by": owner}
            for m, owner in request.app[POOL].models()]
    return web.json_response({"object": "list", "data": data})


async def healthz(request: web.Request) -> web.Response:
    return web.json_response({"status": "ok"})


async def readyz(request: web.Request) -> web.Response:
    pool = request.app[POOL]
    backends = {b.name: {"ready": b.ready, "lane": b.lane, "error": b.last_error} for b in pool}
    if pool.any_ready():
        return web.json_response({"status": "ready", "backends": backends})
    raise RouterError(503, "no backend is ready", type="service_unavailable", code="not_ready",
                      headers={"Retry-After": "1"})


async def metrics(request: web.Request) -> web.Response:
    exposure = request.app[SETTINGS].expose_metrics
    if exposure == "off":
        raise errors.not_found("metrics are disabled (expose_metrics = \"off\")")
    if exposure == "loopback" and not _from_loopback(request):
        raise RouterError(403, "metrics are served to loopback clients only", code="forbidden")
    body = request.app[METRICS].render()
    return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE})


def _from_loopback(request: web.Request) -> bool:
    peer = request.remote or ""
    return peer.startswith("127.") or peer in ("::1", "localhost")


def setup_routes(app: web.Application) -> None:
    app.router.add_post("/v1/chat/completions", chat)
    app.router.add_post("/v1/completions", completions)
    app.router.add_post("/v1/embeddings", embeddings)
    app.router.add_get("/v1/models", models)
    app.router.add_get("/healthz", healthz)
    app.router.add_get("/readyz", readyz)
    app.router.add_get("/metrics", metrics)
