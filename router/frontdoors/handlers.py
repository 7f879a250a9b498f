"""The thin HTTP side of the Anthropic and Ollama front doors.

Generation requests run the OpenAI endpoints' pipeline (``router.proxy.handlers.proxy``:
client identification, policies, admission, classification, lanes, overrides, relay,
telemetry, decision headers) with a translator; errors are rendered in each API's shape by
the error middleware, which knows the API by the path (``doorerrors.api_for_path``).
"""

from __future__ import annotations

import dataclasses
import time
from datetime import UTC, datetime, timedelta
from typing import Any

import orjson
from aiohttp import web

from router.config.policies import Policy
from router.frontdoors import anthropic_in, anthropic_out, ollama_in, ollama_info
from router.frontdoors.anthropic_out import AnthropicEgress
from router.frontdoors.common import to_parsed
from router.frontdoors.ollama_out import Kind, OllamaEgress, now_iso
from router.frontdoors.responses_http import setup_responses_routes
from router.frontdoors.tokencount import count_on_lane
from router.kernel import errors
from router.proxy.body import read_object, read_raw
from router.proxy.booking import Booking
from router.proxy.handlers import Inbound, identify, listed, listing, proxy, request_key
from router.proxy.handlers import models as openai_models
from router.proxy.middleware import expect_handler
from router.proxy.normalise import normalise
from router.proxy.ondemand import model_loaded
from router.proxy.outcome import Outcome
from router.proxy.request import load_object
from router.proxy.services import Services, bind


def anthropic_key(request: web.Request) -> str | None:
    """Anthropic clients send their key as ``x-api-key``; Claude Code with
    ``ANTHROPIC_AUTH_TOKEN`` sends ``Authorization: Bearer``. Either identifies the client."""
    return request_key(request, use_api_key_header=True)


# --- Anthropic -------------------------------------------------------------------------------

ANTHROPIC_VERSION_HEADER = "anthropic-version"  # every Anthropic SDK request carries it


async def models(services: Services, request: web.Request) -> web.Response:
    """``GET /v1/models``: OpenAI's list, or Anthropic's for a caller that sends
    ``anthropic-version`` (the two APIs share the path)."""
    if ANTHROPIC_VERSION_HEADER not in request.headers:
        return await openai_models(services, request)
    policy = identify(services, request, anthropic_key(request))
    body = anthropic_out.model_list(listing(services, policy), policy.caps.max_tokens)
    return web.json_response(body)


async def messages(services: Services, request: web.Request) -> web.StreamResponse:
    def work(raw: bytes) -> Inbound:
        req = anthropic_in.to_openai(load_object(raw))
        egress = AnthropicEgress(req.model, req.stop_sequences, req.applied_edits)
        return to_parsed("chat", req.openai), egress

    async def translate(raw: bytes) -> Inbound:
        return await services.cpu.run(len(raw), work, raw)

    return await proxy(
        services, request, "chat", api="anthropic", translate=translate, api_key_header=True
    )


async def count_tokens(services: Services, request: web.Request) -> web.Response:
    """The prompt's tokens under the lanes' own tokenizer and chat template, admitted like a
    generation request (``router.frontdoors.tokencount``); its body is read under the same
    limit (``max_body_bytes``) and deadline."""
    outcome = Outcome(endpoint="count_tokens", arrival=time.monotonic(), api="anthropic")
    with Booking(services, outcome, served_model=True) as book:
        policy = identify(services, request, anthropic_key(request))
        book.client = policy.client
        raw = await read_raw(services, request)
        req = await services.cpu.run(len(raw), _count_request, raw)
        book.model = req.model
        count = await count_on_lane(
            services,
            policy,
            req.model,
            lambda served: _counted(req, policy),
            outcome,
            permission_type="permission_error",
        )
        return web.json_response({"input_tokens": count})


def _counted(req: anthropic_in.MessagesRequest, policy: Policy) -> dict[str, Any]:
    """What a generation request would render: normalised as ``proxy()`` normalises it
    (not counted as a prefix break: nothing is prefilled)."""
    body = anthropic_in.count_body(req)
    messages, _ = normalise(body["messages"], policy.normalise_prompts)
    return body if messages is None else {**body, "messages": messages}


def _count_request(raw: bytes) -> anthropic_in.MessagesRequest:
    return anthropic_in.to_openai(load_object(raw), for_count=True)


# --- Ollama -----------------------------------------------------------------------------------


async def ollama_chat(services: Services, request: web.Request) -> web.StreamResponse:
    arrival = time.monotonic()

    def work(raw: bytes) -> Inbound:
        req = ollama_in.chat_to_openai(load_object(raw))
        return _ollama_parsed(req, "chat", arrival)

    async def translate(raw: bytes) -> Inbound:
        return await services.cpu.run(len(raw), work, raw)

    return await proxy(
        services, request, "chat", api="ollama", translate=translate, arrival=arrival
    )


async def ollama_generate(services: Services, request: web.Request) -> web.StreamResponse:
    arrival = time.monotonic()
    # The one body reader; aiohttp keeps the bytes for proxy()'s own read.
    body = await read_object(services, request)
    if ollama_in.is_load_request(body):
        return await _ollama_load(services, request, body, arrival)

    def work() -> Inbound:
        return _ollama_parsed(ollama_in.generate_to_openai(body), "generate", arrival)

    async def translate(raw: bytes) -> Inbound:
        return await services.cpu.run(len(raw), work)

    return await proxy(
        services, request, "chat", api="ollama", translate=translate, arrival=arrival
    )


async def _ollama_load(
    services: Services, request: web.Request, body: dict[str, Any], arrival: float
) -> web.Response:
    """A generate request without a prompt: load the model (one of ours loads now, as for
    a request), or with ``keep_alive: 0`` unload it; answered at once, like Ollama."""
    policy = identify(services, request)
    req = ollama_in.generate_to_openai(body)
    parsed, _ = _ollama_parsed(req, "generate", arrival)
    manager = services.started.models
    name = manager.resolve(req.model) if manager is not None else None
    unloading = req.keep_alive == 0
    if manager is None or name is None:
        _served(services, request, req.model)  # 404 when nothing serves it
    elif not (unloading and manager.state(name) != "loaded"):
        async with (
            services.limiter.slot(policy.client, policy.max_concurrency, policy.queue_timeout),
            model_loaded(manager, services.pool, parsed, policy),
        ):
            pass
    answer = {
        "model": req.model,
        "created_at": now_iso(),
        "response": "",
        "done": True,
        "done_reason": "unload" if unloading else "load",
    }
    if parsed.load_seconds:
        answer["load_duration"] = int(parsed.load_seconds * 1e9)
    return web.json_response(answer)


def _ollama_parsed(req: ollama_in.OllamaRequest, kind: Kind, arrival: float) -> Inbound:
    """The request to route (with its ``keep_alive``) and the answer's translation, which
    reports the request's wait for its model as ``load_duration``."""
    parsed = to_parsed(req.endpoint, req.openai)
    parsed.keep_alive = req.keep_alive
    return parsed, OllamaEgress(kind, req.model, arrival, loaded=lambda: parsed.load_seconds)


def _models(services: Services, request: web.Request) -> list[ollama_info.ServedModel]:
    """What the Ollama door lists, shows and pulls: the models the caller's policy lets it
    use (and, for a model of ours not loaded, load): ``router.proxy.handlers.listed``."""
    policy = identify(services, request)
    seen: dict[str, ollama_info.ServedModel] = {}
    for b in services.pool:
        for m in sorted(b.models):
            if not listed(policy, m, True):
                continue
            fmt = "mlx" if b.lane is not None else b.kind
            if m not in seen or (b.ready and not seen[m].ready):
                seen[m] = ollama_info.ServedModel(m, fmt, b.ready, architecture=b.architecture)
    contexts = services.pool.context_lengths()
    for m, row in seen.items():
        if (n := contexts.get(m)) is not None:
            seen[m] = dataclasses.replace(row, context_length=n)
    manager = services.started.models
    for entry in manager.models() if manager is not None else []:
        name, known = entry["name"], seen.get(entry["name"])
        loaded = entry["state"] == "loaded"
        if not listed(policy, name, loaded):
            seen.pop(name, None)
            continue
        seen[name] = ollama_info.ServedModel(
            name,
            "mlx",
            known.ready if known is not None else False,
            size=entry["size_bytes"],
            loadable=not loaded,
            expires_at=_expiry(entry["expires_in"]),
            context_length=known.context_length if known is not None else None,
            architecture=known.architecture if known is not None else None,
        )
    return sorted(seen.values(), key=lambda m: m.name)


def _expiry(seconds: float | None) -> str:
    """Ollama's ``expires_at`` of a model ``seconds`` from unloading (None: not counting)."""
    if seconds is None:
        return ollama_info.NEVER_EXPIRES
    when = datetime.now(UTC) + timedelta(seconds=seconds)
    return when.isoformat(timespec="seconds").replace("+00:00", "Z")


def _served(services: Services, request: web.Request, name: str) -> ollama_info.ServedModel:
    for m in _models(services, request):
        if m.name == name:
            return m
    raise errors.not_found(f"model '{name}' not found", param="model", code="model_not_found")


async def ollama_tags(services: Services, request: web.Request) -> web.Response:
    identify(services, request)
    models = _models(services, request)
    return web.json_response(ollama_info.tags(models, services.up_since_iso))


async def ollama_ps(services: Services, request: web.Request) -> web.Response:
    identify(services, request)
    return web.json_response(ollama_info.ps(_models(services, request)))


async def ollama_show(services: Services, request: web.Request) -> web.Response:
    identify(services, request)
    body = await read_object(services, request)
    name = body.get("model") or body.get("name")  # "name" is the older clients' field
    if not isinstance(name, str) or not name:
        raise errors.bad_request("'model' is required", param="model")
    served = _served(services, request, name)
    return web.json_response(ollama_info.show(served, services.up_since_iso))


async def ollama_pull(services: Services, request: web.Request) -> web.Response:
    identify(services, request)
    body = await read_object(services, request)  # under the body rules, like every endpoint
    name = body.get("model") or body.get("name")
    if not isinstance(name, str) or not name:
        raise errors.bad_request("'model' is required", param="model")
    # Ollama answers a failed pull with 200 and an error line, which is what its clients
    # (the ollama libraries, Codex) read and show.
    line = ollama_info.pull(name, _models(services, request))
    if body.get("stream") is False:
        if "error" in line:
            raise errors.not_found(line["error"], param="model", code="model_not_found")
        return web.json_response(line)
    return web.Response(body=orjson.dumps(line) + b"\n", content_type="application/x-ndjson")


async def ollama_version(request: web.Request) -> web.Response:
    return web.json_response(ollama_info.version())


def setup_frontdoor_routes(app: web.Application, services: Services) -> None:
    add_post, add_get = app.router.add_post, app.router.add_get
    add_get("/v1/models", bind(services, models), expect_handler=expect_handler)
    add_post("/v1/messages", bind(services, messages))
    add_post("/v1/messages/count_tokens", bind(services, count_tokens))
    add_post("/api/chat", bind(services, ollama_chat))
    add_post("/api/generate", bind(services, ollama_generate))
    add_get("/api/tags", bind(services, ollama_tags))
    add_post("/api/show", bind(services, ollama_show))
    add_get("/api/ps", bind(services, ollama_ps))
    add_get("/api/version", ollama_version)
    add_post("/api/pull", bind(services, ollama_pull))
    setup_responses_routes(app, services)
