"""The benchmarks' streaming client: POST an OpenAI chat completion with ``stream: true``,
record when each content piece arrives, hand each JSON chunk to the caller (framing:
``router/kernel/sse.py``)."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import aiohttp
import orjson

from router.kernel import sse


@dataclass
class Reply:
    """What came back, filled in as it arrives (a cancelled or watching caller sees what has
    come so far). Times: ``perf_counter``."""

    status: int | None = None
    headers: Mapping[str, str] = field(default_factory=dict)
    usage: dict[str, Any] = field(default_factory=dict)  # the last chunk's ``usage``
    done: bool = False  # ``data: [DONE]`` arrived
    error: str | None = None
    sent: float = 0.0
    token_times: list[float] = field(default_factory=list)  # arrival of each content piece
    text: str = ""

    @property
    def ttft(self) -> float | None:
        return self.token_times[0] - self.sent if self.token_times else None

    @property
    def completion_tokens(self) -> int:
        value = self.usage.get("completion_tokens")
        return value if isinstance(value, int) else len(self.token_times)

    @property
    def cached_tokens(self) -> int | None:
        details = self.usage.get("prompt_tokens_details")
        value = details.get("cached_tokens") if isinstance(details, dict) else None
        return value if isinstance(value, int) else None

    def decode_rate(self) -> float | None:
        """Tokens after the first per second after the first."""
        if len(self.token_times) < 2:
            return None
        span = self.token_times[-1] - self.token_times[0]
        return (self.completion_tokens - 1) / span if span > 0 else None


async def stream(
    session: aiohttp.ClientSession,
    url: str,
    body: Mapping[str, Any],
    headers: Mapping[str, str],
    reply: Reply,
    on_chunk: Callable[[dict[str, Any]], bool] = lambda chunk: False,
    limit: aiohttp.ClientTimeout | None = None,
) -> Reply:
    """Fill ``reply`` in; ``on_chunk`` returning True stops reading (and closes the connection,
    so the server cancels); ``limit``: the request's timeout. Raises only on cancellation."""
    reply.sent = time.perf_counter()
    try:
        async with session.post(
            url,
            data=orjson.dumps(body),
            headers={"Content-Type": "application/json", **headers},
            timeout=limit or session.timeout,
        ) as resp:
            reply.status, reply.headers = resp.status, resp.headers
            if resp.status != 200:
                reply.error = f"HTTP {resp.status}: {error_message(await resp.read())}"
                return reply
            async for data in sse.read_payloads(resp.content):
                if sse.is_done(data):
                    reply.done = True
                    break
                chunk = orjson.loads(data)
                if chunk.get("error"):
                    reply.error = f"stream error: {error_message(data)}"
                    break
                if isinstance(chunk.get("usage"), dict):
                    reply.usage = chunk["usage"]
                for choice in chunk.get("choices") or ():
                    if piece := (choice.get("delta") or {}).get("content"):
                        reply.token_times.append(time.perf_counter())
                        reply.text += piece
                if on_chunk(chunk):
                    break
    except (aiohttp.ClientError, TimeoutError, ValueError) as e:
        reply.error = f"{type(e).__name__}: {e}" if str(e) else type(e).__name__
    return reply


async def chat(
    session: aiohttp.ClientSession,
    base_url: str,
    body: Mapping[str, Any],
    headers: Mapping[str, str] | None = None,
    reply: Reply | None = None,
    on_chunk: Callable[[dict[str, Any]], bool] = lambda chunk: False,
) -> Reply:
    """``stream`` a chat completion to ``base_url`` (``.../v1``), with its usage."""
    body = {**body, "stream": True, "stream_options": {"include_usage": True}}
    url = f"{base_url}/chat/completions"
    return await stream(session, url, body, headers or {}, reply or Reply(), on_chunk)


def error_message(body: bytes) -> str:
    """The ``error.message`` of an OpenAI error body, else the body's text (cut short)."""
    with contextlib.suppress(orjson.JSONDecodeError):
        data = orjson.loads(body)
        error = data.get("error") if isinstance(data, dict) else None
        if isinstance(error, dict) and error.get("message"):
            return str(error["message"])[:300]
    return body.decode(errors="replace").strip()[:300] or "(empty body)"
