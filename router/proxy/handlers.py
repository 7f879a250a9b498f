"""HTTP handlers: parse, decide, relay. Everything they raise is rendered by the middleware."""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import time

import orjson
from aiohttp import web

from router import errors
from router.admin import is_loopback, require_admin
from router.appkeys import LIMITER, METRICS, POLICIES, POOL, RELAY, ROUTING, SETTINGS, SPEC
from router.backends.base import Backend
from router.config.policies import CLIENT_HEADER, Policy, bearer_token
from router.errors import RouterError
from router.metrics import CONTENT_TYPE
from router.proxy import observe
from router.proxy.relay import BodyFor, Outcome
from router.proxy.request import ParsedRequest, parse_request
from router.proxy.telemetry import SpecClaim
from router.routing.classify import (
    LANE_HEADER,
    PRESET_HEADER,
    Classification,
    RequestFacts,
    classify,
    log_line,
    response_headers,
)
from router.routing.types import Candidate, Endpoint

log = logging.getLogger("speclane.route")

UPSTREAM_PATHS: dict[Endpoint, str] = {
    "chat": "/chat/completions",
    "completions": "/completions",
    "embeddings": "/embeddings",
}


def identify(request: web.Request) -> Policy:
    headers = request.headers
    return request.app[POLICIES].current.identify(
        bearer_token(headers.get("Authorization")), headers.get(CLIENT_HEADER),
        headers.get("User-Agent"))


def decide(request: web.Request, parsed: ParsedRequest, policy: Policy,
           claim: SpecClaim) -> Classification:
    app = request.app
    settings = app[SETTINGS]
    facts = RequestFacts(
        parsed.route,
        preset_header=request.headers.get(PRESET_HEADER),
        lane_header=request.headers.get(LANE_HEADER),
        body_keys=frozenset(parsed.data),
    )
    telemetry = app[SPEC]
    result = classify(facts, policy, settings.presets, app[POOL].snapshot(),
                      gate=app[ROUTING].gate, spec=telemetry.advisor(claim),
                      rules=settings.routing)
    app[ROUTING].gate = result.gate
    decision = telemetry.claim_route(result.decision, claim)
    if decision is not result.decision:
        result = dataclasses.replace(result, decision=decision)
    for key, value in result.body_changes.items():
        parsed.set_field(key, value)
    if log.isEnabledFor(logging.DEBUG):
        log.debug("%s client=%s %s", parsed.route.endpoint, result.client, log_line(result))
    return result


def body_for(parsed: ParsedRequest) -> BodyFor:
    def build(backend: Backend, cand: Candidate) -> bytes:
        if backend.lane == "speculative" and not cand.speculative:
            # Same lane, same model, plain decoding: how the lane serves a workload
            # where speculation is off (and the baseline it is compared against).
            return orjson.dumps({**parsed.data, "num_draft_tokens": 0})
        return parsed.body()

    return build


async def proxy(request: web.Request, endpoint: Endpoint) -> web.StreamResponse:
    arrival = time.monotonic()
    outcome = Outcome(endpoint=endpoint, arrival=arrival)
    app = request.app
    metrics = app[METRICS]
    client = "unidentified"
    claim = SpecClaim()
    try:
        policy = identify(request)
        client = policy.client
        parsed = parse_request(endpoint, await request.read())
        limiter = app[LIMITER]
        async with limiter.slot(client, policy.max_concurrency, policy.queue_timeout) as waited:
            result = decide(request, parsed, policy, claim)
            metrics.decisions.labels(client, result.decision.candidates[0].lane,
                                     result.decision.labels.get("rule", "none")).inc()
            overhead = time.monotonic() - arrival - waited
            metrics.overhead.labels(endpoint).observe(overhead)
            headers = {**response_headers(result),
                       "X-Speclane-Overhead-Ms": f"{overhead * 1000:.3f}",
                       "X-Speclane-Queue-Ms": f"{waited * 1000:.3f}"}
            return await app[RELAY].forward(
                request, parsed, result.decision, path=UPSTREAM_PATHS[endpoint],
                outcome=outcome, body_for=body_for(parsed), headers=headers)
    except RouterError as e:
        outcome.status, outcome.error = e.status, e
        client = e.headers.setdefault(CLIENT_HEADER, client)
        if e.status in (401, 403):
            metrics.rejections.labels(client, str(e.status)).inc()
        raise
    except asyncio.CancelledError:
        outcome.client_left()  # not a disconnect once the stream's [DONE] reached the client
        raise
    finally:
        outcome.finished_at = time.monotonic()
        observe.record(metrics, outcome)
        app[SPEC].observe(outcome, claim)


async def chat(request: web.Request) -> web.StreamResponse:
    return await proxy(request, "chat")


async def completions(request: web.Request) -> web.StreamResponse:
    return await proxy(request, "completions")


async def embeddings(request: web.Request) -> web.StreamResponse:
    return await proxy(request, "embeddings")


async def models(request: web.Request) -> web.Response:
    identify(request)  # a router that requires keys does not list its models to strangers
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
    if exposure == "loopback" and not is_loopback(request):
        raise RouterError(403, "metrics are served to loopback clients only", code="forbidden")
    if exposure == "admin":
        require_admin(request)
    body = request.app[METRICS].render()
    return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE})


def setup_routes(app: web.Application) -> None:
    app.router.add_post("/v1/chat/completions", chat)
    app.router.add_post("/v1/completions", completions)
    app.router.add_post("/v1/embeddings", embeddings)
    app.router.add_get("/v1/models", models)
    app.router.add_get("/healthz", healthz)
    app.router.add_get("/readyz", readyz)
    app.router.add_get("/metrics", metrics)
