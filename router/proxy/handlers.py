"""HTTP handlers: parse, decide, relay. Everything they raise is rendered by the middleware."""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import time
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

from aiohttp import web

from router.backends.base import Backend
from router.config.names import API_KEY_HEADER, AUTHORIZATION, CLIENT_HEADER
from router.config.policies import Identity, Policy, PolicySet, Unauthorized
from router.kernel import errors
from router.kernel.errors import RouterError
from router.metrics import CLIENT_LABEL, CONTENT_TYPE
from router.proxy import doorerrors, observe
from router.proxy.accesslog import record_of
from router.proxy.admin_auth import is_loopback, proves_admin, require_admin
from router.proxy.body import read_raw
from router.proxy.credentials import presented_key
from router.proxy.early import EarlyStream, early_stream
from router.proxy.headers import decision_headers
from router.proxy.middleware import expect_handler
from router.proxy.normalise import normalise
from router.proxy.ondemand import model_loaded
from router.proxy.outcome import Outcome
from router.proxy.partition import wire_token
from router.proxy.relay import BodyFor, Egress, Stop
from router.proxy.request import ParsedRequest, parse_request
from router.proxy.services import Services, bind
from router.proxy.telemetry import SpecClaim
from router.routing.affinity import fingerprints
from router.routing.classify import (
    LANE_HEADER,
    PRESET_HEADER,
    Classification,
    RequestFacts,
    classify,
    log_line,
)
from router.routing.prefixwatch import REASON as PREFIX_REASON
from router.routing.speculate import asked_source
from router.routing.types import Candidate, Endpoint

if TYPE_CHECKING:  # handed in by router.app: lanes/ sits beside proxy/
    from router.lanes.models import ModelManager

log = logging.getLogger("speclane.route")

UPSTREAM_PATHS: dict[Endpoint, str] = {
    "chat": "/chat/completions",
    "completions": "/completions",
    "embeddings": "/embeddings",
}


# A front door's request, already translated: the OpenAI request to route and forward, and
# how to reshape the answer for its client (None: relayed as it comes).
Inbound = tuple[ParsedRequest, Egress | None]
# The door's translation of the body; it runs the work over a large body or a long stored
# conversation off the event loop (``router.proxy.offload``).
Translate = Callable[[bytes], Awaitable[Inbound]]


def caller(services: Services, request: web.Request, key: str | None = None) -> tuple[Policy, str]:
    """The client's policy, from its key (``Authorization: Bearer`` unless a front door found
    it elsewhere, e.g. Anthropic's ``x-api-key``), ``X-Speclane-Client`` and User-Agent; and
    its prompt-cache partition (``PolicySet.cache_partition``)."""
    identity, policies = _identity(services, request, key)
    return identity.policy, policies.cache_partition(identity)


def _identity(
    services: Services, request: web.Request, key: str | None
) -> tuple[Identity, PolicySet]:
    headers = request.headers
    if key is None:
        key = request_key(request)
    policies = services.policies.current
    try:
        identity = policies.match(key, headers.get(CLIENT_HEADER), headers.get("User-Agent"))
        policies.authorize(identity)
    except Unauthorized as refused:
        raise doorerrors.unauthorized(refused.message, refused.code, refused.client) from None
    return identity, policies


def owner(services: Services, request: web.Request, key: str | None = None) -> tuple[Policy, str]:
    """The client's policy and whose stored items (the Responses store) the request may
    reach: its client's, apart by the strength of what identified it. A key proves who
    calls; a client label or user agent proves nothing, so a caller with only a label never
    reaches what a key holder of the same policy stored (nor the other way round)."""
    identity, _ = _identity(services, request, key)
    proof = "key" if identity.via == "api_key" else "label"
    return identity.policy, f"{proof}:{identity.policy.client}"


def request_key(request: web.Request, *, use_api_key_header: bool = False) -> str | None:
    """The request's one API key; a 400 when its credential headers disagree."""
    headers = request.headers
    return presented_key(
        headers.getall(AUTHORIZATION, []),
        headers.getall(API_KEY_HEADER, []),
        use_api_key_header=use_api_key_header,
    )


def identify(services: Services, request: web.Request, key: str | None = None) -> Policy:
    return caller(services, request, key)[0]


def decide(
    services: Services,
    request: web.Request,
    parsed: ParsedRequest,
    policy: Policy,
    claim: SpecClaim,
    prints: tuple[bytes, ...] = (),
) -> Classification:
    settings = services.settings
    routing = services.routing
    facts = RequestFacts(
        parsed.route,
        preset_header=request.headers.get(PRESET_HEADER),
        lane_header=request.headers.get(LANE_HEADER),
        body_keys=frozenset(parsed.data),
        cache_holder=routing.affinity.holder(prints) if prints else None,
    )
    telemetry = services.spec
    result = classify(
        facts,
        policy,
        settings.presets,
        services.pool.snapshot(),
        gate=routing.gate,
        spec=telemetry.advise,
        rules=settings.routing,
        batch_spec=telemetry.advise_batching,
    )
    routing.gate = result.gate
    decision = telemetry.claim_route(result, claim)
    if decision is not result.decision:
        result = dataclasses.replace(result, decision=decision)
    for key, value in result.body_changes.items():
        parsed.set_field(key, value)
    if log.isEnabledFor(logging.DEBUG):
        log.debug("%s client=%s %s", parsed.route.endpoint, result.client, log_line(result))
    return result


def normalised(services: Services, parsed: ParsedRequest, policy: Policy, outcome: Outcome) -> None:
    """The policy's prompt-normalisation rules applied to a chat request, before anything
    reads its messages (the affinity fingerprints, the lanes); the rules that fired are
    counted and booked (``router.proxy.normalise``)."""
    if parsed.endpoint != "chat" or not policy.normalise_prompts:
        return
    messages, fired = normalise(parsed.data["messages"], policy.normalise_prompts)
    if messages is None:
        return
    parsed.set_field("messages", messages)
    outcome.normalised = fired
    for rule in fired:
        services.metrics.prefix_breaks.labels(policy.client, rule).inc()


def watch_prefix(
    services: Services, outcome: Outcome, prints: tuple[bytes, ...], messages: int, client: str
) -> None:
    """A chat request a lane answered whole: did the lane read from its cache what the
    conversation's previous request left there (``router.routing.prefixwatch``)? Counted
    and booked when it did not."""
    backend = outcome.backend
    assert backend is not None
    usage = outcome.reported_usage() or {}
    details = usage.get("prompt_tokens_details")
    cached = details.get("cached_tokens") if isinstance(details, dict) else None
    prompt = usage.get("prompt_tokens")
    shortfall = services.routing.prefixes.served(
        prints,
        min(messages, len(prints)),
        backend.cache_domain or backend.name,
        prompt if type(prompt) is int else None,
        cached if type(cached) is int else None,
    )
    if shortfall is not None:
        outcome.prefix_break = shortfall.describe()
        services.metrics.prefix_breaks.labels(client, PREFIX_REASON).inc()


def body_for(parsed: ParsedRequest) -> BodyFor:
    """The body each backend gets. The lanes: ``num_draft_tokens: 0`` to decode plainly, or
    the ``draft_source`` chosen for the request's family (on each lane its own, judged
    apart). An external backend: as validated, with late system messages folded when it is
    set to (``system_messages = "fold"``, the default of every kind but ``openai``)."""

    def build(backend: Backend, cand: Candidate) -> bytes:
        if backend.lane is None:
            return parsed.body(fold_system=backend.fold_system)
        return parsed.body(plain=not cand.speculative, draft_source=asked_source(cand))

    return build


async def proxy(
    services: Services,
    request: web.Request,
    endpoint: Endpoint,
    *,
    api: doorerrors.Api = "openai",
    translate: Translate | None = None,
    key: str | None = None,
    api_key_header: bool = False,
    arrival: float | None = None,
    stop: Stop | None = None,
) -> web.StreamResponse:
    """The whole pipeline, for every front door: identify, admit, classify, relay.

    ``translate`` turns another API's request body into the OpenAI request (and its answer
    back); without it the body is an OpenAI request to ``endpoint``. ``stop``: how its
    client may stop it from elsewhere (``router.proxy.relay.Stop``).
    """
    arrival = time.monotonic() if arrival is None else arrival
    outcome = Outcome(endpoint=endpoint, arrival=arrival, api=api)
    metrics = services.metrics
    client = "unidentified"
    model: str | None = None
    decision: str | None = None
    claim = SpecClaim()
    prints: tuple[bytes, ...] = ()
    messages = 0  # a chat request's, when it has prints
    early: EarlyStream | None = None
    try:
        if key is None and api_key_header:  # an API with its own key header (Anthropic's)
            key = request_key(request, use_api_key_header=True)
        policy, partition = caller(services, request, key)
        client = policy.client
        raw = await read_raw(services, request)
        egress: Egress | None = None
        if translate is None:
            parsed = await services.cpu.run(len(raw), parse_request, endpoint, raw)
        else:
            parsed, egress = await translate(raw)
            endpoint = outcome.endpoint = parsed.endpoint  # e.g. Ollama's raw generate
        model = parsed.route.model
        normalised(services, parsed, policy, outcome)
        parsed.cache_partition = wire_token(partition)
        limiter = services.limiter
        # A stream may begin before its answer: while its model loads (models of ours
        # only: without them ``model_loaded`` is a no-op), and while the relay waits for a
        # long prefill's first token (every backend).
        manager = services.started.models
        early = early_stream(
            request,
            api,
            parsed.route.stream,
            egress.stream_content_type if egress is not None else None,
            egress.error if egress is not None else None,
            egress.keep_alive if egress is not None else None,
        )
        # Admission first: a request waits for its model's load only inside one of its
        # client's slots, so a client's requests hold at most its max_concurrency places in
        # the load queue (``lanes.load_queue``), never everyone's.
        async with (
            limiter.slot(client, policy.max_concurrency, policy.queue_timeout) as waited,
            model_loaded(manager, services.pool, parsed, policy, early.tick if early else None),
        ):
            model = parsed.route.model
            # Fingerprints serve only to send a conversation back to the lane holding its
            # prefix: without lanes of ours nothing ever holds one, so none are computed.
            # They are the partition's and the model's own: another client's traffic, or
            # the same conversation with another model's lanes, never steers this request.
            if services.settings.routing.cache_affinity and services.pool.has_lanes:
                prints = fingerprints(endpoint, parsed.data, f"{partition}\0{model}")
                messages = len(parsed.data.get("messages") or ())
            result = decide(services, request, parsed, policy, claim, prints)
            outcome.model = result.model
            decision = result.decision.reason
            metrics.decisions.labels(
                client,
                result.decision.candidates[0].lane,
                result.decision.labels.get("rule", "none"),
            ).inc()
            # A model's load is not speclane's overhead: it is the model starting.
            overhead = time.monotonic() - arrival - waited - parsed.load_seconds
            metrics.overhead.labels(endpoint).observe(overhead)
            headers = decision_headers(result, overhead, waited, parsed.load_seconds)
            return await services.relay.forward(
                request,
                parsed,
                result.decision,
                path=UPSTREAM_PATHS[endpoint],
                outcome=outcome,
                body_for=body_for(parsed),
                headers=headers,
                egress=egress,
                begun=early,
                stop=stop,
            )
    except RouterError as e:
        outcome.status, outcome.error = e.status, e
        client = e.headers.setdefault(CLIENT_HEADER, client)
        if e.status in (401, 403):
            metrics.rejections.labels(client, str(e.status)).inc()
        if early is not None and early.response is not None:
            outcome.stream = True
            return await early.fail(e)  # its headers (200) are out: an error event ends it
        raise
    except asyncio.CancelledError:
        outcome.client_left()  # not a disconnect once the stream's [DONE] reached the client
        raise
    except Exception:
        err = errors.internal_error()
        outcome.status, outcome.error = err.status, err  # booked as the client gets it
        if early is None or early.response is None:
            raise  # the error middleware answers it (500 internal_error, the traceback logged)
        log.exception("internal error on a begun stream (%s)", endpoint)
        outcome.stream = True
        return await early.fail(err)
    finally:
        outcome.finished_at = time.monotonic()
        if prints and outcome.status == 200 and outcome.backend and outcome.backend.lane:
            services.routing.affinity.record(prints, outcome.backend.lane)
            if endpoint == "chat" and outcome.completed:
                watch_prefix(services, outcome, prints, messages, client)
        observe.record(metrics, outcome)
        services.spec.observe(outcome, claim)
        services.access.add(record_of(outcome, client=client, model=model, decision=decision))


async def chat(services: Services, request: web.Request) -> web.StreamResponse:
    return await proxy(services, request, "chat")


async def completions(services: Services, request: web.Request) -> web.StreamResponse:
    return await proxy(services, request, "completions")


async def embeddings(services: Services, request: web.Request) -> web.StreamResponse:
    return await proxy(services, request, "embeddings")


async def models(services: Services, request: web.Request) -> web.Response:
    # A router that requires keys does not list its models to strangers, and a client sees
    # only what its policy lets it use.
    policy = identify(services, request)
    rows = listing(services, policy)
    return web.json_response({"object": "list", "data": rows})


def listing(services: Services, policy: Policy) -> list[dict[str, Any]]:
    """``model_list`` of what is served now, each row with the context its lanes report."""
    rows = model_list(services.pool.models(), services.started.models, policy)
    contexts = services.pool.context_lengths()
    for row in rows:
        if (n := contexts.get(row["id"])) is not None:
            # Both names OpenAI-compatible servers use (OpenRouter and LM Studio's
            # context_length, vLLM's max_model_len); OpenAI's own list has none.
            row["context_length"] = row["max_model_len"] = n
    return rows


def listed(policy: Policy | None, model: str, loaded: bool) -> bool:
    """Does a listing show ``model`` to this client: one its policy lets it use, and, when it
    is a model of ours not loaded now, one it may load."""
    if policy is None:
        return True
    return policy.allows_model(model) and (loaded or policy.allows_load(model))


def model_list(
    served: list[tuple[str, str]], manager: ModelManager | None, policy: Policy | None = None
) -> list[dict[str, Any]]:
    """Every model a backend serves now, and every model of ours (loaded or not) with its
    state and size under ``speclane``, sorted by id; with ``policy``, only those ``listed``
    for that client."""
    data = {
        m: {"id": m, "object": "model", "created": 0, "owned_by": owner}
        for m, owner in served
        if listed(policy, m, True)
    }
    for entry in manager.models() if manager is not None else []:
        if not listed(policy, entry["name"], entry["state"] == "loaded"):
            data.pop(entry["name"], None)
            continue
        row = data.setdefault(
            entry["name"],
            {"id": entry["name"], "object": "model", "created": 0, "owned_by": "speclane"},
        )
        row["speclane"] = {"state": entry["state"], "size_bytes": entry["size_bytes"]}
    return [data[m] for m in sorted(data)]


async def healthz(request: web.Request) -> web.Response:
    return web.json_response({"status": "ok"})


async def readyz(services: Services, request: web.Request) -> web.Response:
    pool = services.pool
    backends = {b.name: {"ready": b.ready, "lane": b.lane, "error": b.last_error} for b in pool}
    if pool.any_ready():
        return web.json_response({"status": "ready", "backends": backends})
    raise RouterError(
        503,
        "no backend is ready",
        type="service_unavailable",
        code="not_ready",
        headers={"Retry-After": "1"},
    )


async def metrics(services: Services, request: web.Request) -> web.Response:
    exposure = services.settings.expose_metrics
    if exposure == "off":
        raise errors.not_found('metrics are disabled (expose_metrics = "off")')
    if exposure == "loopback" and not is_loopback(request):
        raise RouterError(403, "metrics are served to loopback clients only", code="forbidden")
    if exposure == "admin":
        require_admin(services, request)
    # A closed router (its default policy requires a key) names its clients only to whoever
    # proves to be its operator; anyone else reads every figure with the clients summed.
    closed = services.policies.current.default.require_api_key
    without = CLIENT_LABEL if closed and not proves_admin(services, request) else None
    body = services.metrics.render(without=without)
    return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE})


def setup_routes(app: web.Application, services: Services) -> None:
    add_post, add_get = app.router.add_post, app.router.add_get
    add_post("/v1/chat/completions", bind(services, chat), expect_handler=expect_handler)
    add_post("/v1/completions", bind(services, completions), expect_handler=expect_handler)
    add_post("/v1/embeddings", bind(services, embeddings), expect_handler=expect_handler)
    add_get("/healthz", healthz, expect_handler=expect_handler)
    add_get("/readyz", bind(services, readyz), expect_handler=expect_handler)
    add_get("/metrics", bind(services, metrics), expect_handler=expect_handler)
