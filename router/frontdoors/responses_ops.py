"""The Responses API's endpoints beside creating one: ``GET /v1/responses/{id}/input_items``,
``POST /v1/responses/{id}/cancel`` and ``POST /v1/responses/input_tokens``.

Each identifies its client as every request does, and sees only that client's responses
(another client's id is not found, as one that never existed). Cancelling a running
response (a stream, or a background response) closes its upstream request at once, which
frees the lane's slot, and answers the response, ``cancelled``; cancelling one that already
ended is a 400, as OpenAI answers. ``input_tokens`` is counted like Anthropic's
``count_tokens``: by a lane, under its chat template, tools included, admitted like a
generation request; a model only an external backend serves is counted by that backend
where its kind can, else estimated (``router.frontdoors.externalcount``).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from typing import Any

from aiohttp import web

from router.frontdoors import responses_in, responses_items
from router.frontdoors.common import counted
from router.frontdoors.externalcount import count_on_backend
from router.frontdoors.responses_in import missing
from router.frontdoors.responses_running import CANCEL_WAIT
from router.frontdoors.tokencount import count_on_lane, tokenizing_lane
from router.kernel import errors
from router.kernel.errors import RouterError
from router.proxy.booking import Booking
from router.proxy.connections import read_body
from router.proxy.handlers import owner
from router.proxy.outcome import Outcome
from router.proxy.request import load_object
from router.proxy.services import Services

# Fields of a create request that do not change what the prompt holds: dropped before the
# request is translated for a count.
NOT_COUNTED = ("stream", "background", "store")
# What the lanes answer when they cannot count a model: an external backend serving it may.
LANES_CANNOT = ("no_lane_ready", "model_not_found")


async def input_items(services: Services, request: web.Request) -> web.Response:
    _, client = owner(services, request)
    resp_id = request.match_info["response_id"]
    query = responses_items.page_query(request.query)
    entry = services.responses.get(client, resp_id)
    if entry is None:
        raise missing(resp_id)
    return web.json_response(responses_items.page(entry.items, query))


async def cancel(services: Services, request: web.Request) -> web.Response:
    _, client = owner(services, request)
    resp_id = request.match_info["response_id"]
    running = services.running.get(client, resp_id)
    if running is not None:
        running.stop.request()
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(asyncio.shield(running.done.wait()), CANCEL_WAIT)
        final = running.egress.final or running.egress.ended_whole("cancelled")
        return web.json_response(final)
    entry = services.responses.get(client, resp_id)
    if entry is None:
        raise missing(resp_id)
    status = entry.response.get("status")
    if status == "cancelled":  # cancelling twice answers the same
        return web.json_response(entry.response)
    raise errors.bad_request(
        f"Cannot cancel a response whose status is '{status}': only a response still "
        "running (a stream, or a background response) can be cancelled",
        code="response_not_cancellable",
    )


async def input_tokens(services: Services, request: web.Request) -> web.Response:
    outcome = Outcome(endpoint="input_tokens", arrival=time.monotonic(), api="responses")
    with Booking(services, outcome, served_model=True) as book:
        policy, who = owner(services, request)
        book.client = policy.client
        raw = await read_body(request, services.settings.client_limits.body_timeout)
        body = {k: v for k, v in load_object(raw).items() if k not in NOT_COUNTED}
        model = body.get("model")
        if model is None:  # optional here, as in OpenAI's API: the lanes' model
            model = _lanes_model(services)
            body["model"] = model
        book.model = model if isinstance(model, str) else None
        previous = responses_in.previous_id(body)
        history: list[dict[str, Any]] = []
        if previous is not None:
            entry = services.responses.get(who, previous)
            if entry is None:
                raise missing(previous, "previous_response_id")
            history = entry.messages
        req = responses_in.to_openai(body, history)
        try:
            count = await count_on_lane(
                services, policy, req.model, lambda served: counted(req.openai), outcome
            )
        except RouterError as e:
            if e.code not in LANES_CANNOT or not _externals_answer(services, req.model):
                raise
            # No lane serves the model: the external backend that does counts (or estimates);
            # without lanes, a model nobody serves is a 404 as on the other endpoints.
            answer = await count_on_backend(services, policy, req.model, req.openai, outcome)
            return web.json_response(answer)
        return web.json_response({"object": "response.input_tokens", "input_tokens": count})


def _externals_answer(services: Services, model: str) -> bool:
    """An external backend serves ``model``, or there are no lanes at all."""
    if not any(b.lane is not None for b in services.pool):
        return True
    return any(b.lane is None and b.ready and model in b.models for b in services.pool)


def _lanes_model(services: Services) -> str:
    if not any(b.lane is not None and b.ready for b in services.pool):
        raise errors.bad_request(
            "'model' is required: no lane is ready to name its own", param="model"
        )
    models = sorted(tokenizing_lane(services.pool, None).models)
    if not models:
        raise errors.bad_request("'model' is required", param="model")
    return models[0]
