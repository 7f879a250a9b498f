"""The thin HTTP side of the OpenAI Responses API: ``POST /v1/responses`` (and
``/v1/responses/compact``) runs the OpenAI chat pipeline (``router.proxy.handlers.proxy``,
``api="responses"``) with the Responses translators; ``GET``/``DELETE /v1/responses/{id}``
read the client's own stored responses."""

from __future__ import annotations

import time

import orjson
from aiohttp import web

from router import errors
from router.appkeys import SETTINGS
from router.frontdoors import responses_in
from router.frontdoors.common import to_parsed
from router.frontdoors.responses_out import ResponsesEgress
from router.frontdoors.responses_store import ResponseStore
from router.proxy.handlers import Inbound, identify, proxy
from router.proxy.offload import off_loop
from router.proxy.request import load_object

STORE = web.AppKey("responses_store", ResponseStore)


def _missing(resp_id: str, param: str | None = None) -> errors.RouterError:
    # The same answer for an id that never existed, one evicted, and another client's.
    return errors.not_found(
        f"Response with id '{resp_id[:256]}' not found (responses are "
        "kept in memory, per client, and the oldest are evicted)",
        param=param,
        code="response_not_found",
    )


async def create(request: web.Request) -> web.StreamResponse:
    return await _respond(request, compact=False)


async def compact(request: web.Request) -> web.StreamResponse:
    """``POST /v1/responses/compact``: the conversation summarized into one compaction item
    (``responses_compact``), answered whole."""
    return await _respond(request, compact=True)


async def _respond(request: web.Request, *, compact: bool) -> web.StreamResponse:
    arrival = time.monotonic()
    app = request.app
    store = app[STORE]

    async def translate(raw: bytes) -> Inbound:
        client = identify(request).client  # already identified (and allowed) by proxy()
        body = await off_loop(app, len(raw), load_object, raw)
        if compact:
            body = {**body, "stream": False, "store": False}  # the endpoint answers whole
        previous = responses_in.previous_id(body)
        history: list[dict[str, object]] = []
        size = len(raw)
        if previous is not None:
            entry = store.get(client, previous)  # the store is the loop's: read here
            if entry is None:
                raise _missing(previous, "previous_response_id")
            history, size = entry.messages, size + entry.size

        def save(response: dict[str, object], messages: list[dict[str, object]]) -> None:
            store.put(client, str(response["id"]), response, messages)

        def work() -> Inbound:
            # The new input joined to the stored conversation, translated and encoded: work
            # over the whole conversation, however short the new body (off the loop).
            req = responses_in.to_openai(body, history, compact=compact)
            egress = ResponsesEgress(
                req, int(time.time()), save if req.store else None, compact_endpoint=compact
            )
            return to_parsed("chat", req.openai), egress

        return await off_loop(app, size, work)

    return await proxy(request, "chat", api="responses", translate=translate, arrival=arrival)


async def retrieve(request: web.Request) -> web.Response:
    client = identify(request).client
    resp_id = request.match_info["response_id"]
    entry = request.app[STORE].get(client, resp_id)
    if entry is None:
        raise _missing(resp_id)
    # A stored response repeats its request's instructions and tools: up to a whole body.
    body = await off_loop(request.app, entry.size, orjson.dumps, entry.response)
    return web.Response(body=body, content_type="application/json")


async def delete(request: web.Request) -> web.Response:
    client = identify(request).client
    resp_id = request.match_info["response_id"]
    if not request.app[STORE].delete(client, resp_id):
        raise _missing(resp_id)
    return web.json_response({"id": resp_id, "object": "response", "deleted": True})


def setup_responses_routes(app: web.Application) -> None:
    settings = app[SETTINGS].responses
    app[STORE] = ResponseStore(settings.store_entries, settings.store_bytes)
    app.router.add_post("/v1/responses", create)
    app.router.add_post("/v1/responses/compact", compact)
    app.router.add_get("/v1/responses/{response_id}", retrieve)
    app.router.add_delete("/v1/responses/{response_id}", delete)
