"""A Responses request's input tokens when no lane serves its model: counted by the external
backend that does, where its kind can count, else estimated, and said so.

- ``vllm``: its ``POST /tokenize`` takes the chat request (messages, tools) and renders it
  under the model's own template: an exact count.
- ``llamacpp``: ``POST /apply-template`` renders the chat request under the model's template,
  ``POST /tokenize`` counts the text: exact.
- any other kind (``openai``, ``mlx_lm``, ``ollama``, ``lmstudio``...) has no counting
  endpoint: the answer is an estimate, one token per ``CHARS_PER_TOKEN`` characters of the
  messages' text and the tools' JSON, marked ``"estimated": true``.

Admitted like a generation request: one of the client's concurrency slots is held while the
backend counts.
"""

from __future__ import annotations

import math
from typing import Any

import aiohttp
import orjson

from router.backends.base import Backend
from router.config.kinds import KINDS
from router.config.policies import Policy
from router.frontdoors.tokencount import post_for_count
from router.kernel import errors
from router.kernel.errors import RouterError
from router.proxy.outcome import Outcome
from router.proxy.services import Services

COUNT_TIMEOUT = 30.0
CHARS_PER_TOKEN = 4  # English text under a BPE vocabulary, roughly


async def count_on_backend(
    services: Services, policy: Policy, model: str, chat: dict[str, Any], outcome: Outcome
) -> dict[str, object]:
    """The ``input_tokens`` answer for ``chat`` (the translated chat request's messages and
    tools), from a ready external backend serving ``model``."""
    if not policy.allows_model(model):
        raise RouterError(
            403,
            f"client '{policy.client}' may not use model '{model}'",
            param="model",
            code="model_not_allowed",
        )
    backend = serving_backend(services.pool, model)
    outcome.model, outcome.tried, outcome.attempts = model, backend, 1
    async with services.limiter.slot(policy.client, policy.max_concurrency, policy.queue_timeout):
        facts = KINDS.get(backend.kind)
        if facts is None or facts.token_count is None:
            count, estimated = estimate(chat), True
        else:
            count, estimated = await _counted(services, backend, model, chat), False
    outcome.backend, outcome.status = backend, 200
    body: dict[str, object] = {"object": "response.input_tokens", "input_tokens": count}
    if estimated:
        body["estimated"] = True
    return body


def serving_backend(pool: Any, model: str) -> Backend:
    """A ready external backend serving ``model``."""
    ready = [b for b in pool if b.lane is None and b.ready]
    serving = [b for b in ready if model in b.models]
    if not serving:
        raise errors.not_found(
            f"no ready backend serves model '{model}'", param="model", code="model_not_found"
        )
    return serving[0]


def estimate(chat: dict[str, Any]) -> int:
    """One token per ``CHARS_PER_TOKEN`` characters of the messages' text and the tools."""
    chars = 0
    for message in chat.get("messages") or []:
        content = message.get("content") if isinstance(message, dict) else None
        if isinstance(content, str):
            chars += len(content)
        elif isinstance(content, list):
            chars += sum(
                len(p["text"])
                for p in content
                if isinstance(p, dict) and isinstance(p.get("text"), str)
            )
        calls = message.get("tool_calls") if isinstance(message, dict) else None
        if calls:
            chars += len(orjson.dumps(calls))
    if chat.get("tools"):
        chars += len(orjson.dumps(chat["tools"]))
    return math.ceil(chars / CHARS_PER_TOKEN)


async def _counted(services: Services, backend: Backend, model: str, chat: dict[str, Any]) -> int:
    session = services.started.client_session()
    rendered = {k: chat[k] for k in ("messages", "tools") if chat.get(k)}
    if KINDS[backend.kind].token_count == "vllm_tokenize":
        body = {"model": model, **rendered, "add_generation_prompt": True}
        answer = await _post(session, backend, "/tokenize", body)
        return _count(backend, answer.get("count"))
    applied = await _post(session, backend, "/apply-template", rendered)
    prompt = applied.get("prompt")
    if not isinstance(prompt, str):
        raise _malformed(backend)
    tokens = await _post(session, backend, "/tokenize", {"content": prompt, "add_special": True})
    found = tokens.get("tokens")
    return _count(backend, len(found) if isinstance(found, list) else None)


async def _post(
    session: aiohttp.ClientSession, backend: Backend, path: str, body: dict[str, Any]
) -> dict[str, Any]:
    answer = await post_for_count(
        session, backend, backend.root_url + path, orjson.dumps(body), COUNT_TIMEOUT, "backend"
    )
    try:
        parsed = orjson.loads(answer)
    except orjson.JSONDecodeError:
        parsed = None
    if not isinstance(parsed, dict):
        raise _malformed(backend)
    return parsed


def _count(backend: Backend, value: Any) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or value < 0:
        raise _malformed(backend)
    return value


def _malformed(backend: Backend) -> RouterError:
    return errors.upstream_failed(
        f"backend '{backend.name}' answered the count with a malformed body",
        code="upstream_bad_json",
    )
