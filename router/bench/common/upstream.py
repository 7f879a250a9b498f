"""A synthetic OpenAI-shaped upstream, the load target of ``bench overhead``: it answers
instantly with a fixed stream (role chunk, ``max_tokens`` content chunks, finish chunk,
[DONE]), so that what is measured is the proxy, not a model. Never a real backend.

    python -m router.bench.common.upstream --port 0   # prints "UPSTREAM_READY <port>"
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import json

import orjson
from aiohttp import web

from router.kernel import sse

CONTENT_CHUNKS = 7  # when a request asks for none, or for more than MAX_CHUNKS
MAX_CHUNKS = 4096
MESSAGES = [{"role": "user", "content": "hi"}]
PLAIN_BODY = json.dumps({"model": "bench-model", "messages": MESSAGES}).encode()


def _answer(kind: str, **fields: object) -> bytes:
    head = {"id": "chatcmpl-bench", "object": kind, "created": 0, "model": "bench-model"}
    return orjson.dumps({**head, **fields})


def _event(delta: dict, finish: str | None = None) -> bytes:
    choice = {"index": 0, "delta": delta, "finish_reason": finish}
    return sse.frame(_answer("chat.completion.chunk", choices=[choice]))


REPLY = _answer(
    "chat.completion",
    choices=[
        {
            "index": 0,
            "finish_reason": "stop",
            "message": {"role": "assistant", "content": "tok " * CONTENT_CHUNKS},
        }
    ],
    usage={"prompt_tokens": 5, "completion_tokens": CONTENT_CHUNKS, "total_tokens": 12},
)


@functools.lru_cache(maxsize=16)
def stream_events(content_chunks: int) -> tuple[bytes, ...]:
    return (
        _event({"role": "assistant", "content": ""}),
        *[_event({"content": f"tok{i} "}) for i in range(content_chunks)],
        _event({}, "stop"),
        sse.DONE_EVENT,
    )


def stream_body(tokens: int) -> bytes:
    """A streaming request; this upstream answers it with ``tokens`` content chunks."""
    body = {"model": "bench-model", "stream": True, "max_tokens": tokens, "messages": MESSAGES}
    return json.dumps(body).encode()


async def chat(request: web.Request) -> web.StreamResponse:
    body = await request.json(loads=orjson.loads)
    if not body.get("stream"):
        return web.Response(body=REPLY, content_type="application/json")
    chunks = body.get("max_tokens")
    if not isinstance(chunks, int) or not 0 <= chunks <= MAX_CHUNKS:
        chunks = CONTENT_CHUNKS
    resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
    await resp.prepare(request)
    for event in stream_events(chunks):
        await resp.write(event)  # one write per event, as a real server flushes per token
    await resp.write_eof()
    return resp


async def models(request: web.Request) -> web.Response:
    return web.json_response({"object": "list", "data": [{"id": "bench-model", "object": "model"}]})


async def serve(port: int) -> None:
    app = web.Application()
    app.router.add_post("/v1/chat/completions", chat)
    app.router.add_get("/v1/models", models)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", port).start()
    print(f"UPSTREAM_READY {runner.addresses[0][1]}", flush=True)
    await asyncio.Event().wait()


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--port", type=int, default=0)
    asyncio.run(serve(parser.parse_args().port))
