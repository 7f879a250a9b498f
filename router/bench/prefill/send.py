"""``speclane bench prefill``: one streamed request through the door a program uses (chat,
Anthropic Messages, Responses), and what its stream says: the prompt's size, the tokens read
from the cache, the time to the first output (text or a tool call's first piece; the end of
the stream when the answer had none)."""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any, Literal

import aiohttp
import orjson

from router.bench.common.stream import error_message
from router.kernel import sse

Door = Literal["chat", "anthropic", "responses"]
PATHS: dict[Door, str] = {
    "chat": "/chat/completions",
    "anthropic": "/messages",
    "responses": "/responses",
}


@dataclass
class Outcome:
    prompt_tokens: int | None = None
    cached_tokens: int | None = None
    ttft: float | None = None
    text: str = ""
    error: str | None = None


def _first_output(door: Door, event: dict[str, Any]) -> str | None:
    """The output text an event carries ("" for a tool call's piece); None: no output."""
    if door == "chat":
        for choice in event.get("choices") or ():
            delta = choice.get("delta") or {}
            if delta.get("content") or delta.get("tool_calls"):
                return str(delta.get("content") or "")
        return None
    kind = event.get("type")
    if door == "anthropic" and kind == "content_block_delta":
        return str((event.get("delta") or {}).get("text") or "")
    if door == "responses" and kind in (
        "response.output_text.delta",
        "response.function_call_arguments.delta",
    ):
        return str(event.get("delta") or "") if kind == "response.output_text.delta" else ""
    return None


def _usage(door: Door, event: dict[str, Any], out: Outcome) -> None:
    if door == "chat":
        usage = event.get("usage")
        if isinstance(usage, dict) and isinstance(usage.get("prompt_tokens"), int):
            details = usage.get("prompt_tokens_details") or {}
            out.prompt_tokens = usage["prompt_tokens"]
            out.cached_tokens = details.get("cached_tokens") if details else None
    elif door == "anthropic":
        usage = event.get("usage") or (event.get("message") or {}).get("usage")
        if isinstance(usage, dict) and isinstance(usage.get("input_tokens"), int):
            cached = usage.get("cache_read_input_tokens") or 0
            out.prompt_tokens, out.cached_tokens = usage["input_tokens"] + cached, cached
    elif event.get("type") in ("response.completed", "response.incomplete"):  # cut short
        usage = (event.get("response") or {}).get("usage") or {}
        if isinstance(usage.get("input_tokens"), int):
            out.prompt_tokens = usage["input_tokens"]
            out.cached_tokens = (usage.get("input_tokens_details") or {}).get("cached_tokens")


async def send(
    session: aiohttp.ClientSession, base_url: str, door: Door, body: dict[str, Any]
) -> Outcome:
    """POST ``body`` (streamed) to ``base_url`` (``.../v1``) through ``door``."""
    out = Outcome()
    if door == "chat":
        body = {**body, "stream_options": {"include_usage": True}}
    sent = time.perf_counter()
    try:
        async with session.post(
            base_url + PATHS[door],
            data=orjson.dumps(body),
            headers={"Content-Type": "application/json"},
        ) as resp:
            if resp.status != 200:
                out.error = f"HTTP {resp.status}: {error_message(await resp.read())}"
                return out
            async for data in sse.read_payloads(resp.content):
                if sse.is_done(data):
                    break
                event = orjson.loads(data)
                if not isinstance(event, dict):
                    continue
                if event.get("error") or event.get("type") in ("error", "response.failed"):
                    out.error = f"stream error: {error_message(data)}"
                    break
                piece = _first_output(door, event)
                if piece is not None:
                    out.ttft = out.ttft or time.perf_counter() - sent
                    out.text += piece
                _usage(door, event, out)
    except (aiohttp.ClientError, TimeoutError, ValueError) as e:
        out.error = f"{type(e).__name__}: {e}" if str(e) else type(e).__name__
    if out.ttft is None and out.error is None:
        out.ttft = time.perf_counter() - sent  # no output piece: the answer's end
    return out
