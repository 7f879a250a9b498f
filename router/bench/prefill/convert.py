"""``speclane bench prefill``: a program's body as the chat request ``mlx_lm.server`` gets
(pure, given the tokenizer).

``mlx_lm.server`` has only the chat endpoint, and its template shows what it is handed. So
the body goes through speclane's own translations, as a lane would see it: the front door's
(``anthropic_in``, ``responses_in``), the worker's parsing (system messages folded, special
tokens escaped: ``router.worker.request.protocol``) and its tool rendering
(``router.worker.decoding.tools``: a template without tools gets them in the system message,
calls and results as text). Both targets then render the same text, except what speclane's
proxy normalises (``router.proxy.normalise``): that is what the bench measures.
"""

from __future__ import annotations

from typing import Any

from router.bench.prefill.send import Door
from router.frontdoors import anthropic_in, responses_in
from router.worker.decoding.tools import chat_inputs, syntax_for
from router.worker.request.protocol import parse_generation_request


def openai_body(door: Door, body: dict[str, Any]) -> dict[str, Any]:
    """The OpenAI chat body speclane's front door makes of ``body``."""
    if door == "anthropic":
        return anthropic_in.to_openai(body).openai
    if door == "responses":
        return responses_in.to_openai(body).openai
    return body


def for_mlx_lm(door: Door, body: dict[str, Any], tokenizer: Any, model: str) -> dict[str, Any]:
    """The chat body for ``mlx_lm.server`` (served as ``model``): the messages and tools as
    the lane's worker hands them to the chat template."""
    request = parse_generation_request(openai_body(door, body), "chat")
    messages, tools = chat_inputs(request, syntax_for(tokenizer, request))
    out: dict[str, Any] = {
        "model": model,
        "messages": messages,
        "max_tokens": request.max_tokens,
        "temperature": 0,
        "stream": True,
    }
    if tools:
        out["tools"] = tools
    return out
