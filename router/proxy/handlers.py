"""HTTP handlers: parse, decide, relay. Everything they raise is rendered by the middleware."""

from __future__ import annotations

import logging
import time
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

from aiohttp import web

from router.config.names import API_KEY_HEADER, AUTHORIZATION, CLIENT_HEADER
from router.config.policies import Identity, Policy, PolicySet, Unauthorized
from router.kernel import errors
from router.kernel.errors import RouterError
from router.metrics import CLIENT_LABEL, CONTENT_TYPE
from router.proxy import doorerrors
from router.proxy.admin_auth import is_loopback, proves_admin, require_admin
from router.proxy.body import read_raw
from router.proxy.booking import Booking
from router.proxy.credentials import presented_key
from router.proxy.early import EarlyStream, early_stream
from router.proxy.headers import decision_headers
from router.proxy.middleware import expect_handler
from router.proxy.normalise import normalise
from router.proxy.ondemand import model_loaded
from router.proxy.outcome import Outcome
from router.proxy.partition import wire_token
from router.proxy.relay import Egress, Stop
from router.proxy.request import ParsedRequest, parse_request
from router.proxy.services import Services, bind
from router.proxy.speculation import SpecClaim
from router.routing.affinity import fingerprints
from router.routing.classify import (
    LANE_HEADER,
    PRESET_HEADER,
    Classification,
    RequestFacts,
    log_line,
    resolve,
    route,
)
from router.routing.pace import PaceBook, Start
from router.routing.prefixwatch import REASON as PREFIX_REASON
from router.routing.types import Endpoint

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
    prints: tuple[bytes, ...] = (),
) -> tuple[Classification, SpecClaim]:
    """resolve -> advise -> route -> claim: routing is pure and takes what the speculation
    decision (``services.spec``) says as values; the claim settles the first candidate."""
    settings, routing, spec = services.settings, services.routing, services.spec
    facts = RequestFacts(
        parsed.route,
        preset_header=request.headers.get(PRESET_HEADER),
        lane_header=request.headers.get(LANE_HEADER),
        body_keys=frozenset(parsed.data),
        cache_holder=routing.affinity.holder(prints) if prints else None,
    )
    resolved = resolve(facts, policy, settings.presets, services.pool.snapshot())
    advised = spec.advise(resolved)
    paces = routing.paces.snapshot() if facts.cache_holder is not None else None
    result = route(resolved, advised, gate=routing.gate, rules=settings.routing, paces=paces)
    routing.gate = result.gate
    for key, value in result.body_changes.items():
        parsed.set_field(key, value)
    result, claim = spec.claim(result)  # last: a ticket taken always reaches its owner
    if log.isEnabledFor(logging.DEBUG):
        log.debug("%s client=%s %s", parsed.route.endpoint, result.client, log_line(result))
    return result, claim


def headers_for(
    services: Services,
    parsed: ParsedRequest,
    result: Classification,
    outcome: Outcome,
    waited: float,
) -> dict[str, str]:
    """The decision counted, and its X-Speclane-* headers. The overhead is the router's time
    to here without the admission queue's wait and the model's load (the model starting)."""
    outcome.model = result.model
    decision, metrics = result.decision, services.metrics
    metrics.decisions.labels(
        result.client, decision.candidates[0].lane, decision.labels.get("rule", "none")
    ).inc()
    overhead = time.monotonic() - outcome.arrival - waited - parsed.load_seconds
    metrics.overhead.labels(parsed.endpoint).observe(overhead)
    return decision_headers(result, overhead, waited, parsed.load_seconds)


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


def affinity_prints(
    services: Services, parsed: ParsedRequest, partition: str
) -> tuple[tuple[bytes, ...], int]:
    """The conversation's prefix fingerprints, and its messages. They serve only to send a
    conversation back to the lane holding its prefix: without lanes of ours nothing ever
    holds one, so none are computed. They are the partition's and the model's own: another
    client's traffic, or the same conversation with another model's lanes, never steers it."""
    if not (services.settings.routing.cache_affinity and services.pool.has_lanes):
        return (), 0
    key = f"{partition}\0{parsed.route.model}"
    return fingerprints(parsed.endpoint, parsed.data, key), len(parsed.data.get("messages") or ())


def paced(book: PaceBook, outcome: Outcome, holder: str | None, prompt_chars: int) -> None:
    """A lane's answer measures its pace (``router.routing.pace``): its first token, by
    whether the lane held the prefix, and a whole stream's decode among its company."""
    lane = outcome.backend.lane if outcome.backend else None
    if lane is None or outcome.first_byte_at is None:
        return
    start: Start = "cold" if holder is None else "held" if holder == lane else "moved"
    book.started(lane, start, outcome.first_byte_at - outcome.arrival, prompt_chars)
    tokens = outcome.reported_tokens()
    if outcome.stream and outcome.completed and tokens and outcome.last_byte_at is not None:
        seconds = outcome.last_byte_at - outcome.first_byte_at
        book.decoded(lane, outcome.rows or 1.0, tokens - 1, seconds)


class Proxied(Booking):
    """A proxied request's bookkeeping, and what its end needs of its way through the
    pipeline: the claim of its speculation decision, its prefix fingerprints."""

    __slots__ = ("claim", "holder", "messages", "prints", "prompt_chars")

    def __init__(self, services: Services, outcome: Outcome) -> None:
        super().__init__(services, outcome)
        self.claim: SpecClaim | None = None
        self.prints: tuple[bytes, ...] = ()
        self.messages = 0  # a chat request's, when it has prints
        self.holder: str | None = None  # the lane that held its prefix when it was routed
        self.prompt_chars = 0

    def ended(self) -> None:
        """The affinity map records which lane now holds the prefix (and whether the lane
        found it), the lane's pace is measured; the answer's speculative statistics are
        counted and complete the decision."""
        services, outcome, prints = self.services, self.outcome, self.prints
        if prints and outcome.status == 200 and outcome.backend and outcome.backend.lane:
            paced(services.routing.paces, outcome, self.holder, self.prompt_chars)
            services.routing.affinity.record(prints, outcome.backend.lane)
            if outcome.endpoint == "chat" and outcome.completed:
                watch_prefix(services, outcome, prints, self.messages, self.client)
        if (claim := self.claim) is not None:
            seen = services.counts.answer(outcome, *claim.names(outcome))
            services.spec.complete(outcome, claim, seen)


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
    """The whole pipeline, for every front door: identify, read, admit (and load the model),
    decide (resolve -> advise -> route -> claim), relay; at the end, ``Proxied.ended``.
    ``translate``: another API's body into the OpenAI request (and its answer back); without
    it the body is an OpenAI request to ``endpoint``. ``stop``: how its client may stop it
    from elsewhere (``router.proxy.relay.Stop``)."""
    outcome = Outcome(endpoint, time.monotonic() if arrival is None else arrival, api)
    early: EarlyStream | None = None
    with Proxied(services, outcome) as book:
        try:
            if key is None and api_key_header:  # an API with its own key header (Anthropic's)
                key = request_key(request, use_api_key_header=True)
            policy, partition = caller(services, request, key)
            book.client = policy.client
            raw = await read_raw(services, request)
            egress: Egress | None = None
            if translate is None:
                parsed = await services.cpu.run(len(raw), parse_request, endpoint, raw)
            else:
                parsed, egress = await translate(raw)
            endpoint = outcome.endpoint = parsed.endpoint  # e.g. Ollama's raw generate
            book.model = parsed.route.model
            normalised(services, parsed, policy, outcome)
            parsed.cache_partition = wire_token(partition)
            # A stream may begin before its answer: while its model loads (models of ours
            # only: without them ``model_loaded`` is a no-op), and while the relay waits for
            # a long prefill's first token (every backend).
            early = early_stream(request, api, parsed.route.stream, egress)
            tick = early.tick if early else None
            # Admission first: a request waits for its model's load only inside one of its
            # client's slots, so a client's requests hold at most its max_concurrency places
            # in the load queue (``lanes.load_queue``), never everyone's.
            slot = services.limiter.slot(book.client, policy.max_concurrency, policy.queue_timeout)
            loaded = model_loaded(services.started.models, services.pool, parsed, policy, tick)
            async with slot as waited, loaded:
                book.model = parsed.route.model
                book.prints, book.messages = affinity_prints(services, parsed, partition)
                result, book.claim = decide(services, request, parsed, policy, book.prints)
                book.holder = result.decision.labels.get("cache_holder") or None
                book.prompt_chars = parsed.route.prompt_chars
                book.decision = result.decision.reason
                headers = headers_for(services, parsed, result, outcome, waited)
                return await services.relay.forward(
                    request,
                    parsed,
                    result.decision,
                    path=UPSTREAM_PATHS[endpoint],
                    outcome=outcome,
                    headers=headers,
                    egress=egress,
                    begun=early,
                    stop=stop,
                )
        except RouterError as e:
            book.client = e.headers.setdefault(CLIENT_HEADER, book.client)
            if e.status in (401, 403):
                services.metrics.rejections.labels(book.client, str(e.status)).inc()
            if early is None or early.response is None:
                raise
            book.failed(e)
            outcome.stream = True
            return await early.fail(e)  # its headers (200) are out: an error event ends it
        except Exception:
            if early is None or early.response is None:
                raise  # the error middleware answers it (500 internal_error, the traceback logged)
            log.exception("internal error on a begun stream (%s)", endpoint)
            err = errors.internal_error()
            book.failed(err)  # booked as the client gets it
            outcome.stream = True
            return await early.fail(err)


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
