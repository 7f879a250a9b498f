"""A prompt's tokens counted by a lane, under its own tokenizer and chat template, tools
included: Anthropic's ``count_tokens`` and the Responses API's ``input_tokens``.

A count is admitted like a generation request: it takes one of its client's concurrency
slots first (waiting in the client's queue, 429 past ``queue_timeout``), then the model may
be one of ours that loads (``holding``) while the slot is held, and the lane counts. On the
lane a count never goes ahead of preparing a generation request
(``router.worker.http.tokenizing``).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import aiohttp
import orjson

from router.backends.base import Backend
from router.config.policies import Policy
from router.kernel import errors
from router.kernel.errors import RouterError
from router.proxy.ondemand import holding
from router.proxy.outcome import Outcome
from router.proxy.services import Services

TOKENIZE_PATH = "/tokenize"  # under a lane worker's /v1 (router.worker.http.server)
TOKENIZE_TIMEOUT = 30.0


async def count_on_lane(
    services: Services,
    policy: Policy,
    model: str,
    body_for: Callable[[str], dict[str, Any]],
    outcome: Outcome,
    *,
    permission_type: str = "invalid_request_error",
) -> int:
    """The tokens of ``body_for(model)`` (the /tokenize body, given the model that serves),
    counted by a lane serving ``model``; ``outcome`` is filled for the books."""
    if not policy.allows_model(model):
        raise RouterError(
            403,
            f"client '{policy.client}' may not use model '{model}'",
            type=permission_type,
            param="model",
            code="model_not_allowed",
        )
    # Admission before any wait for a model's load (as every request: proxy()).
    async with (
        services.limiter.slot(policy.client, policy.max_concurrency, policy.queue_timeout),
        holding(services.started.models, services.pool, model, policy) as held,
    ):
        served = held.model if held is not None else model  # a model of ours loads first
        lane = tokenizing_lane(services.pool, served)
        outcome.model = served
        try:  # orjson writes 254 levels of nesting, reads 1024 (as parse_request says)
            body = orjson.dumps(body_for(served))
        except orjson.JSONEncodeError as e:
            raise errors.bad_request(
                f"request body cannot be forwarded: {e}", code="invalid_json"
            ) from e
        outcome.tried, outcome.attempts = lane, 1
        count = await _count(services.started.client_session(), lane, body)
    outcome.backend, outcome.status = lane, 200
    return count


# A count's answer is a few bytes; a backend's /tokenize lists every token (a few bytes each).
MAX_COUNT_ANSWER = 16 << 20


async def post_for_count(
    session: aiohttp.ClientSession,
    upstream: Backend,
    url: str,
    body: bytes,
    seconds: float,
    what: str = "lane",
) -> bytes:
    """POST ``body`` to a lane's or backend's counting endpoint: its answer's bytes, read
    under ``MAX_COUNT_ANSWER`` and ``seconds``; any failure is the upstream's error (the
    4xx it answered is passed on)."""
    timeout = aiohttp.ClientTimeout(total=seconds, connect=upstream.connect_timeout)
    try:
        async with session.post(
            url,
            data=body,
            headers={"Content-Type": "application/json", **upstream.auth_headers()},
            timeout=timeout,
        ) as resp:
            answer = bytearray()
            async for chunk in resp.content.iter_chunked(64 * 1024):
                answer += chunk
                if len(answer) > MAX_COUNT_ANSWER:
                    raise errors.upstream_failed(
                        f"{what} '{upstream.name}' answered the count with more than "
                        f"{MAX_COUNT_ANSWER} bytes",
                        code="upstream_too_large",
                    )
            status = resp.status
    except TimeoutError as e:
        raise errors.upstream_timeout(
            f"{what} '{upstream.name}' did not count the tokens in {seconds:g}s"
        ) from e
    except aiohttp.ClientError as e:
        raise errors.upstream_failed(f"could not reach {what} '{upstream.name}': {e}") from e
    if status >= 400:
        raise errors.from_upstream_body(status, bytes(answer))
    return bytes(answer)


async def _count(session: aiohttp.ClientSession, lane: Backend, body: bytes) -> int:
    answer = await post_for_count(
        session, lane, lane.base_url + TOKENIZE_PATH, body, TOKENIZE_TIMEOUT
    )
    try:
        count = orjson.loads(answer)["count"]
    except (orjson.JSONDecodeError, KeyError, TypeError):
        count = None
    if not isinstance(count, int) or isinstance(count, bool) or count < 0:
        raise errors.upstream_failed(
            f"lane '{lane.name}' answered the count with a malformed body", code="upstream_bad_json"
        )
    return count


def tokenizing_lane(pool: Any, model: str | None) -> Backend:
    """A ready lane serving ``model`` (None: any ready lane)."""
    lanes = [b for b in pool if b.lane is not None and b.ready]
    if not lanes:
        raise errors.unavailable(
            "token counts are answered by the MLX lanes, and none is ready", code="no_lane_ready"
        )
    serving = [b for b in lanes if model is None or model in b.models]
    if not serving:
        raise errors.not_found(
            f"the lanes do not serve model '{model}' (they serve "
            f"{', '.join(sorted(lanes[0].models))})",
            param="model",
            code="model_not_found",
        )
    return serving[0]
