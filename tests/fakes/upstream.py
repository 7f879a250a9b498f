"""A fake OpenAI-compatible upstream: a real aiohttp server on 127.0.0.1 port 0.

It streams like the real backends (role chunk, content chunks, a finish chunk, the usage
chunk when asked, ``data: [DONE]``), and can be told to misbehave per request: error
statuses, stalls before or after headers, dying mid-stream, malformed bodies, a wrong
content type, a missing [DONE]. With ``system_first`` it refuses a chat request whose
system message is not first, as mlx_lm.server does for a Qwen chat template (404, "System
message must be at the beginning."). Backend-specific statistics are merged into the final
chunk / body through ``final_extra`` / ``body_extra`` exactly where the real server puts
them. It records every request and notices when the caller goes away.
"""

from __future__ import annotations

import asyncio
import itertools
import time
from collections import deque
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field, replace
from typing import Any

import orjson
from aiohttp import web

# What a Qwen chat template raises, and mlx_lm.server answers (404), for a late system message.
SYSTEM_FIRST_MESSAGE = "System message must be at the beginning."


@dataclass(frozen=True)
class Behaviour:
    status: int = 200
    error_message: str = "fake upstream error"
    chunks: int = 5  # content chunks in a stream / words in a body
    interval: float = 0.0  # seconds between stream chunks
    delay_headers: float = 0.0  # sleep before answering at all
    stall_after: int | None = None  # stream: stop sending (forever) after N chunks
    ping_every: float | None = None  # while stalled: send ": ping" comments this often
    die_after: int | None = None  # stream: cut the TCP connection after N chunks
    content_type: str | None = None  # override the content type
    raw_body: bytes | None = None  # send exactly these bytes (malformed JSON/SSE)
    no_done: bool = False  # end the stream without data: [DONE]
    final_extra: dict[str, Any] = field(default_factory=dict)  # merged into the last chunk
    body_extra: dict[str, Any] = field(default_factory=dict)  # merged into a JSON body
    usage_extra: dict[str, Any] = field(default_factory=dict)  # merged into usage
    prompt_tokens: int = 7


@dataclass
class Seen:
    path: str
    body: dict[str, Any]
    headers: dict[str, str]
    started: float
    finished: bool = False
    cancelled: bool = False


class FakeUpstream:
    def __init__(
        self,
        models: tuple[str, ...] = ("fake-model",),
        behaviour: Behaviour | None = None,
        name: str = "fake",
        system_first: bool = False,
        max_body: int = 1024**2,  # aiohttp's default
    ) -> None:
        self.models = models
        self.system_first = system_first
        self.max_body = max_body
        self.behaviour = behaviour or Behaviour()
        self.name = name
        self.script: deque[Behaviour] = deque()  # per-request behaviours, used first
        self.requests: list[Seen] = []
        self.request_started = asyncio.Event()
        self.request_cancelled = asyncio.Event()
        self.models_status = 200
        # When set, generation requests are answered only once this is set: a long prefill
        # (the caller sets it when it has seen what it waits for).
        self.release: asyncio.Event | None = None
        # When set, GET /v1/models answers only once this is set: a backend that accepts
        # connections but does not answer its health check.
        self.models_gate: asyncio.Event | None = None
        self.models_asked = asyncio.Event()
        self.active = 0
        self._ids = itertools.count(1)
        self._runner: web.AppRunner | None = None
        self.port = 0

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    @property
    def cancelled(self) -> int:
        return sum(1 for r in self.requests if r.cancelled)

    def then(self, *behaviours: Behaviour) -> None:
        self.script.extend(behaviours)

    def make_app(self) -> web.Application:
        app = web.Application(client_max_size=self.max_body)
        app.router.add_get("/v1/models", self._models)
        app.router.add_get("/health", self._health)  # what mlx_lm.server offers
        app.router.add_post("/v1/chat/completions", self._generate)
        app.router.add_post("/v1/completions", self._generate)
        app.router.add_post("/v1/embeddings", self._embeddings)
        # Token counting as vLLM (/tokenize with messages) and llama.cpp (/apply-template,
        # then /tokenize with content) answer it; a "token" is a character here.
        app.router.add_post("/tokenize", self._tokenize)
        app.router.add_post("/apply-template", self._apply_template)
        return app

    async def start(self) -> None:
        self._runner = web.AppRunner(self.make_app(), handler_cancellation=True, access_log=None)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        self.port = self._runner.addresses[0][1]

    async def stop(self) -> None:
        if self._runner:
            await self._runner.cleanup()

    # --- handlers -------------------------------------------------------------------------

    async def _models(self, request: web.Request) -> web.Response:
        self.models_asked.set()
        if self.models_gate is not None:
            await self.models_gate.wait()
        if self.models_status != 200:
            return web.json_response({"error": {"message": "down"}}, status=self.models_status)
        data = [{"id": m, "object": "model", "owned_by": self.name} for m in self.models]
        return web.json_response({"object": "list", "data": data})

    async def _tokenize(self, request: web.Request) -> web.Response:
        body = await request.json()
        self.requests.append(Seen(request.path, body, dict(request.headers), time.monotonic()))
        if "messages" in body:  # vLLM's chat form
            text = self._template(body)
            return web.json_response({"count": len(text), "max_model_len": 4096, "tokens": []})
        return web.json_response({"tokens": list(range(len(body["content"])))})

    async def _apply_template(self, request: web.Request) -> web.Response:
        body = await request.json()
        self.requests.append(Seen(request.path, body, dict(request.headers), time.monotonic()))
        return web.json_response({"prompt": self._template(body)})

    @staticmethod
    def _template(body: dict[str, Any]) -> str:
        """``<role>content`` per message, then the tools' JSON."""
        text = "".join(f"<{m['role']}>{m.get('content') or ''}" for m in body["messages"])
        return text + (orjson.dumps(body["tools"]).decode() if body.get("tools") else "")

    async def _health(self, request: web.Request) -> web.Response:
        up = self.models_status == 200
        return web.json_response(
            {"status": "ok" if up else "unavailable"}, status=200 if up else 503
        )

    def _next_behaviour(self) -> Behaviour:
        return self.script.popleft() if self.script else self.behaviour

    async def _generate(self, request: web.Request) -> web.StreamResponse:
        body = await request.json()
        seen = Seen(request.path, body, dict(request.headers), time.monotonic())
        self.requests.append(seen)
        self.request_started.set()
        if self.system_first and _late_system(body.get("messages")):
            err = {"error": {"message": SYSTEM_FIRST_MESSAGE, "type": "invalid_request_error"}}
            return web.json_response(err, status=404)
        self.active += 1
        b = self._next_behaviour()
        try:
            resp = await self._answer(request, body, b)
            seen.finished = True
            return resp
        except (asyncio.CancelledError, ConnectionResetError):
            seen.cancelled = True
            self.request_cancelled.set()
            raise
        finally:
            self.active -= 1

    async def _answer(
        self, request: web.Request, body: dict[str, Any], b: Behaviour
    ) -> web.StreamResponse:
        if self.release is not None:
            await self.release.wait()
        if b.delay_headers:
            await asyncio.sleep(b.delay_headers)
        if b.status >= 400:
            err = {"error": {"message": b.error_message, "type": "server_error", "code": b.status}}
            return web.json_response(err, status=b.status)
        chat = request.path.endswith("/chat/completions")
        if body.get("stream"):
            return await self._stream(request, body, b, chat)
        if b.raw_body is not None:
            return web.Response(body=b.raw_body, content_type=b.content_type or "application/json")
        words = [f"w{i}" for i in range(b.chunks)]
        text = " ".join(words)
        choice: dict[str, Any] = {"index": 0, "finish_reason": "stop"}
        if chat:
            choice["message"] = {"role": "assistant", "content": text}
        else:
            choice["text"] = text
        answer = {
            "id": f"cmpl-{next(self._ids)}",
            "object": "chat.completion" if chat else "text_completion",
            "created": int(time.time()),
            "model": body.get("model"),
            "choices": [choice],
            "usage": self._usage(b),
            **b.body_extra,
        }
        return web.Response(
            body=orjson.dumps(answer), content_type=b.content_type or "application/json"
        )

    def _usage(self, b: Behaviour) -> dict[str, Any]:
        return {
            "prompt_tokens": b.prompt_tokens,
            "completion_tokens": b.chunks,
            "total_tokens": b.prompt_tokens + b.chunks,
            **b.usage_extra,
        }

    async def _stream(
        self, request: web.Request, body: dict[str, Any], b: Behaviour, chat: bool
    ) -> web.StreamResponse:
        resp = web.StreamResponse(headers={"Content-Type": b.content_type or "text/event-stream"})
        await resp.prepare(request)
        if b.raw_body is not None:
            await resp.write(b.raw_body)
            await resp.write_eof()
            return resp
        cid = f"chatcmpl-{next(self._ids)}"
        base = {
            "id": cid,
            "object": "chat.completion.chunk" if chat else "text_completion",
            "created": int(time.time()),
            "model": body.get("model"),
        }

        def event(
            choice_delta: dict[str, Any] | None, finish: str | None = None, **extra: Any
        ) -> bytes:
            choices = []
            if choice_delta is not None:
                choice: dict[str, Any] = {"index": 0, "finish_reason": finish}
                if chat:
                    choice["delta"] = choice_delta
                else:
                    choice["text"] = choice_delta.get("content", "")
                choices.append(choice)
            return b"data: " + orjson.dumps({**base, "choices": choices, **extra}) + b"\n\n"

        include_usage = bool((body.get("stream_options") or {}).get("include_usage"))
        await resp.write(event({"role": "assistant", "content": ""}))
        for i in range(b.chunks):
            if b.stall_after is not None and i >= b.stall_after:
                while b.ping_every is not None:  # sse-starlette's keep-alive, forever
                    await resp.write(b": ping\n\n")
                    await asyncio.sleep(b.ping_every)
                await asyncio.Event().wait()  # stall forever (until cancelled)
            if b.die_after is not None and i >= b.die_after:
                assert request.transport is not None
                request.transport.abort()
                raise ConnectionResetError("fake upstream died mid-stream")
            if b.interval:
                await asyncio.sleep(b.interval)
            await resp.write(event({"content": f"w{i} "}))
        final_extra = dict(b.final_extra)
        if not include_usage:
            await resp.write(event({}, "stop", **final_extra))
        else:
            await resp.write(event({}, "stop"))
            await resp.write(event(None, usage=self._usage(b), **final_extra))
        if not b.no_done:
            await resp.write(b"data: [DONE]\n\n")
        await resp.write_eof()
        return resp

    async def _embeddings(self, request: web.Request) -> web.Response:
        body = await request.json()
        seen = Seen(request.path, body, dict(request.headers), time.monotonic(), finished=True)
        self.requests.append(seen)
        inputs = body.get("input")
        items = inputs if isinstance(inputs, list) else [inputs]
        data = [
            {"object": "embedding", "index": i, "embedding": [0.1, 0.2, 0.3]}
            for i, _ in enumerate(items)
        ]
        return web.json_response(
            {
                "object": "list",
                "data": data,
                "model": body.get("model"),
                "usage": {"prompt_tokens": 3, "total_tokens": 3},
            }
        )


def _late_system(messages: Any) -> bool:
    """A system message anywhere but first (the Qwen templates' guard, ``loop.first``);
    ``developer`` is refused anywhere, as a role those templates do not know."""
    if not isinstance(messages, list):
        return False
    return any(
        isinstance(m, dict)
        and (m.get("role") == "developer" or (m.get("role") == "system" and i > 0))
        for i, m in enumerate(messages)
    )


@asynccontextmanager
async def fake_upstream(**kwargs: Any) -> AsyncIterator[FakeUpstream]:
    fake = FakeUpstream(**kwargs)
    await fake.start()
    try:
        yield fake
    finally:
        await fake.stop()


__all__ = ["SYSTEM_FIRST_MESSAGE", "Behaviour", "FakeUpstream", "fake_upstream", "replace"]
