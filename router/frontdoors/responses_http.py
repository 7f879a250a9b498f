"""The thin HTTP side of the OpenAI Responses API: ``POST /v1/responses`` (and
``/v1/responses/compact``) runs the OpenAI chat pipeline (``router.proxy.handlers.proxy``,
``api="responses"``) with the Responses translators; ``GET``/``DELETE /v1/responses/{id}``
read the caller's own stored responses (``router.proxy.handlers.owner``: its client, apart by
whether a key proved it). A response runs registered under its client and id
(``responses_running``), so that its client may cancel it; ``background: true`` runs it as
a task of its own (``responses_background``); the other endpoints are in
``responses_ops``."""

from __future__ import annotations

import asyncio
import time

from aiohttp import web

from router.frontdoors import responses_background, responses_in, responses_items, responses_ops
from router.frontdoors.common import to_parsed
from router.frontdoors.responses_out import ResponsesEgress
from router.frontdoors.responses_running import Running
from router.kernel.errors import RouterError
from router.proxy.body import read_object
from router.proxy.handlers import Inbound, owner, proxy
from router.proxy.relay import Stop
from router.proxy.request import load_object
from router.proxy.services import Services, bind

_missing = responses_in.missing


async def create(services: Services, request: web.Request) -> web.StreamResponse:
    # A background response is answered at once: its body is read here (identified
    # first); aiohttp keeps the bytes for proxy()'s own read otherwise.
    try:
        _, who = owner(services, request)
        body = await read_object(services, request)
    except RouterError as e:
        if e.status in (401, 403, 400):  # proxy() books and answers the same refusal
            return await _respond(services, request, compact=False)
        raise
    if body.get("background") not in (None, False):
        return await responses_background.start(services, request, body, who)
    return await _respond(services, request, compact=False)


async def compact(services: Services, request: web.Request) -> web.StreamResponse:
    """``POST /v1/responses/compact``: the conversation summarized into one compaction item
    (``responses_compact``), answered whole."""
    return await _respond(services, request, compact=True)


async def _respond(
    services: Services, request: web.Request, *, compact: bool
) -> web.StreamResponse:
    arrival = time.monotonic()
    store = services.responses
    running = services.running
    made: list[tuple[str, ResponsesEgress]] = []  # (client, egress) once translated
    stop = Stop(asyncio.current_task(), lambda: made[0][1].cancelled() if made else b"")

    async def translate(raw: bytes) -> Inbound:
        _, client = owner(services, request)  # already identified (and allowed) by proxy()
        body = await services.cpu.run(len(raw), load_object, raw)
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
            store.put(client, str(response["id"]), response, messages, items)

        def work() -> tuple[Inbound, list[dict[str, object]]]:
            # The new input joined to the stored conversation, translated and encoded: work
            # over the whole conversation, however short the new body (off the loop).
            req = responses_in.to_openai(body, history, compact=compact)
            egress = ResponsesEgress(
                req, int(time.time()), save if req.store else None, compact_endpoint=compact
            )
            return (to_parsed("chat", req.openai), egress), responses_items.input_items(
                body.get("input")
            )

        (parsed, egress), items = await services.cpu.run(size, work)
        assert isinstance(egress, ResponsesEgress)
        made.append((client, egress))
        running.add(client, egress.id, Running(stop, egress))
        return parsed, egress

    try:
        return await proxy(
            services,
            request,
            "chat",
            api="responses",
            translate=translate,
            arrival=arrival,
            stop=stop,
        )
    finally:
        if made:
            running.end(made[0][0], made[0][1].id)


async def retrieve(services: Services, request: web.Request) -> web.Response:
    _, client = owner(services, request)
    resp_id = request.match_info["response_id"]
    entry = services.responses.get(client, resp_id)
    if entry is None:
        raise _missing(resp_id)
    # Kept as its JSON: answered as it is, nothing decoded or encoded again.
    return web.Response(body=entry.response_json, content_type="application/json")


async def delete(services: Services, request: web.Request) -> web.Response:
    _, client = owner(services, request)
    resp_id = request.match_info["response_id"]
    if not services.responses.delete(client, resp_id):
        raise _missing(resp_id)
    return web.json_response({"id": resp_id, "object": "response", "deleted": True})


def setup_responses_routes(app: web.Application, services: Services) -> None:
    add_post, add_get = app.router.add_post, app.router.add_get
    add_post("/v1/responses", bind(services, create))
    add_post("/v1/responses/compact", bind(services, compact))
    add_post("/v1/responses/input_tokens", bind(services, responses_ops.input_tokens))
    add_get("/v1/responses/{response_id}", bind(services, retrieve))
    app.router.add_delete("/v1/responses/{response_id}", bind(services, delete))
    add_get("/v1/responses/{response_id}/input_items", bind(services, responses_ops.input_items))
    add_post("/v1/responses/{response_id}/cancel", bind(services, responses_ops.cancel))
