"""``speclane bench prefill``'s client: each door's stream read for its usage and its first
output, against a loopback server replaying what speclane's doors send."""

from __future__ import annotations

from collections.abc import AsyncIterator

import aiohttp
import orjson
import pytest
from aiohttp import web

from router.bench.prefill.send import Door, send

STREAMS: dict[str, bytes] = {
    "/v1/chat/completions": (
        b'data: {"choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}}]}\n\n'
        b'data: {"choices": [{"index": 0, "delta": {"content": "Hi"}}]}\n\n'
        b'data: {"choices": [], "usage": {"prompt_tokens": 900, "completion_tokens": 1, '
        b'"prompt_tokens_details": {"cached_tokens": 850}}}\n\ndata: [DONE]\n\n'
    ),
    "/v1/messages": (
        b'event: message_start\ndata: {"type": "message_start", "message": {"usage": '
        b'{"input_tokens": 900, "output_tokens": 0}}}\n\n'
        b": keep-alive\n\n"
        b'event: content_block_start\ndata: {"type": "content_block_start", "index": 0, '
        b'"content_block": {"type": "tool_use", "name": "Read", "input": {}}}\n\n'
        b'event: content_block_delta\ndata: {"type": "content_block_delta", "index": 0, '
        b'"delta": {"type": "input_json_delta", "partial_json": "{\\"f"}}\n\n'
        b'event: message_delta\ndata: {"type": "message_delta", "usage": {"input_tokens": 50, '
        b'"cache_read_input_tokens": 850, "output_tokens": 3}}\n\n'
        b'event: message_stop\ndata: {"type": "message_stop"}\n\n'
    ),
    "/v1/responses": (
        b'event: response.created\ndata: {"type": "response.created"}\n\n'
        b'event: response.output_text.delta\ndata: {"type": "response.output_text.delta", '
        b'"delta": "Hi"}\n\n'
        # max_output_tokens reached: the answer is incomplete, its usage is there all the same
        b'event: response.incomplete\ndata: {"type": "response.incomplete", "response": '
        b'{"usage": {"input_tokens": 900, "input_tokens_details": {"cached_tokens": 850}}}}\n\n'
    ),
}


@pytest.fixture
async def server() -> AsyncIterator[str]:
    async def replay(request: web.Request) -> web.StreamResponse:
        body = orjson.loads(await request.read())
        if body.get("model") == "missing":
            return web.json_response({"error": {"message": "no such model"}}, status=404)
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        await resp.write(STREAMS[request.path])
        return resp

    app = web.Application()
    for path in STREAMS:
        app.router.add_post(path, replay)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = runner.addresses[0][1]
    yield f"http://127.0.0.1:{port}/v1"
    await runner.cleanup()


@pytest.mark.parametrize(("door", "text"), [("chat", "Hi"), ("anthropic", ""), ("responses", "Hi")])
async def test_each_door_reports_the_prompt_the_cache_and_the_first_output(
    server: str, door: Door, text: str
) -> None:
    async with aiohttp.ClientSession() as session:
        out = await send(session, server, door, {"model": "m"})
    assert out.error is None, out.error
    assert (out.prompt_tokens, out.cached_tokens, out.text) == (900, 850, text)
    assert out.ttft is not None and out.ttft > 0


async def test_an_error_is_told_not_raised(server: str) -> None:
    async with aiohttp.ClientSession() as session:
        out = await send(session, server, "anthropic", {"model": "missing"})
    assert out.error == "HTTP 404: no such model" and out.prompt_tokens is None
