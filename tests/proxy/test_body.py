"""The one body reader and the one depth rule (router.proxy.body, request_rules.too_deep):
every endpoint that takes a body refuses nesting past the rule with a 400 in its caller's
API shape (it was a 500 and a traceback on four doors), reads under the body deadline
(``/api/pull`` did not), and answers an undecodable body 400 without a traceback."""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import aiohttp
import orjson
import pytest

from router.kernel.request_rules import MAX_JSON_DEPTH
from tests.conftest import router_settings, run_router
from tests.fakes.upstream import Behaviour, FakeUpstream

MODEL = "fake-model"
HOLE = "@@deep@@"
ASK = [{"role": "user", "content": "hi"}]
TOOL_PARAMETERS = {"type": "object", "properties": {"a": HOLE}}
# Each endpoint with a field that takes any JSON (a schema, a format, tool arguments), and
# the API whose error shape it answers in.
ENDPOINTS: dict[str, tuple[str, dict[str, Any]]] = {
    "/v1/chat/completions": (
        "openai",
        {
            "model": MODEL,
            "messages": ASK,
            "tools": [{"type": "function", "function": {"name": "f", "parameters": HOLE}}],
        },
    ),
    "/v1/completions": ("openai", {"model": MODEL, "prompt": "hi", "logit_bias": HOLE}),
    "/v1/embeddings": ("openai", {"model": MODEL, "input": "hi", "extra": HOLE}),
    "/v1/responses": (
        "openai",
        {
            "model": MODEL,
            "input": "hi",
            "tools": [{"type": "function", "name": "f", "parameters": TOOL_PARAMETERS}],
        },
    ),
    "/v1/responses/compact": (
        "openai",
        {
            "model": MODEL,
            "input": "hi",
            "text": {"format": {"type": "json_schema", "schema": HOLE}},
        },
    ),
    "/v1/messages": (
        "anthropic",
        {
            "model": MODEL,
            "max_tokens": 4,
            "messages": ASK,
            "tools": [{"name": "f", "input_schema": HOLE}],
        },
    ),
    "/v1/messages/count_tokens": (
        "anthropic",
        {"model": MODEL, "messages": ASK, "tools": [{"name": "f", "input_schema": HOLE}]},
    ),
    "/api/chat": ("ollama", {"model": MODEL, "messages": ASK, "format": HOLE}),
    "/api/generate": ("ollama", {"model": MODEL, "prompt": "hi", "format": HOLE}),
    "/api/show": ("ollama", {"model": MODEL, "options": HOLE}),
    "/api/pull": ("ollama", {"model": MODEL, "insecure": HOLE}),
}


def deep(levels: int, kind: str = "object") -> bytes:
    if kind == "array":
        return b"[" * levels + b"1" + b"]" * levels
    return b'{"a":' * levels + b"1" + b"}" * levels


def body_with(template: dict[str, Any], levels: int, kind: str = "object") -> bytes:
    return orjson.dumps(template).replace(orjson.dumps(HOLE), deep(levels, kind))


def assert_refused(api: str, status: int, answer: dict[str, Any]) -> None:
    assert status == 400, answer
    if api == "anthropic":
        assert answer["type"] == "error", answer
        assert answer["error"]["message"].startswith("[body_too_deep]"), answer
    elif api == "ollama":
        assert answer["error"].startswith("[body_too_deep]"), answer
    else:
        assert answer["error"]["code"] == "body_too_deep", answer


class Tracebacks(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.found: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        if record.exc_info or record.levelno >= logging.ERROR:
            self.found.append(logging.Formatter().format(record))


@pytest.fixture
def tracebacks() -> Any:
    handler = Tracebacks()
    logging.getLogger().addHandler(handler)
    try:
        yield handler
    finally:
        logging.getLogger().removeHandler(handler)


@pytest.mark.parametrize("path", sorted(ENDPOINTS))
async def test_nesting_past_the_rule_is_a_400_in_the_callers_shape(
    fake: FakeUpstream, path: str, tracebacks: Tracebacks
) -> None:
    """Was a 500 internal_error and a traceback on /v1/responses, /compact, /v1/messages
    and /api/chat (orjson reads 1,024 levels but writes 254), booked as status 0."""
    api, template = ENDPOINTS[path]
    async with run_router(router_settings(fake)) as r, aiohttp.ClientSession() as s:
        for levels, kind in ((MAX_JSON_DEPTH, "object"), (260, "object"), (900, "array")):
            async with s.post(r.url + path, data=body_with(template, levels, kind)) as resp:
                assert_refused(api, resp.status, await resp.json())
        booked = [rec.status for rec in r.services.access.recent]
    assert not fake.requests
    assert all(status == 400 for status in booked), booked  # the proxied ones: not 0
    assert not tracebacks.found, tracebacks.found[0]


async def test_nesting_at_the_rule_is_forwarded_from_every_door(fake: FakeUpstream) -> None:
    """The rule leaves room for what a door adds: a body at the limit is translated,
    encoded and forwarded (the deepest field goes deeper in the OpenAI request)."""
    limit = MAX_JSON_DEPTH
    cases = {
        # (the hole sits this deep in the body) -> the value's own depth to reach the limit
        "/v1/chat/completions": limit - 4,  # {tools [ {function {parameters
        "/v1/responses": limit - 5,  # {tools [ {parameters {properties {a
        "/v1/messages": limit - 3,  # {tools [ {input_schema
        "/api/chat": limit - 1,  # {format
        "/api/generate": limit - 1,  # {format
        "/v1/responses/compact": limit - 3,  # {text {format {schema
    }
    async with run_router(router_settings(fake)) as r, aiohttp.ClientSession() as s:
        for path, levels in cases.items():
            body = body_with({**ENDPOINTS[path][1], "stream": False}, levels)
            async with s.post(r.url + path, data=body) as resp:
                assert resp.status == 200, (path, await resp.text())
    assert len(fake.requests) == len(cases)


async def test_pull_reads_its_body_under_the_deadline(fake: FakeUpstream) -> None:
    """A trickled body had no answer after 24 s, where /api/show gave a 408."""
    settings = router_settings(fake, client_limits={"body_timeout": 0.3})
    async with run_router(settings) as r:
        for path in ("/api/pull", "/api/show"):
            reader, writer = await asyncio.open_connection("127.0.0.1", r.port)
            writer.write(
                f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
                "Content-Length: 100\r\n\r\n{".encode()
            )
            await writer.drain()
            head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 10)
            length = next(
                int(line.split(b":")[1])
                for line in head.lower().split(b"\r\n")
                if line.startswith(b"content-length:")
            )
            rest = await asyncio.wait_for(reader.readexactly(length), 10)
            writer.close()
            assert head.startswith(b"HTTP/1.1 408"), (path, head)
            assert orjson.loads(rest)["error"].startswith("[request_timeout]"), rest


@pytest.mark.parametrize("path", ["/api/pull", "/api/show", "/v1/chat/completions"])
async def test_an_undecodable_body_is_a_400_without_a_traceback(
    fake: FakeUpstream, path: str, tracebacks: Tracebacks
) -> None:
    """Bad gzip: /api/pull gave a 500 and a traceback; the others a 400, and aiohttp then
    logged the same error as unhandled when it drained the body."""
    async with run_router(router_settings(fake)) as r, aiohttp.ClientSession() as s:
        async with s.post(
            r.url + path,
            data=b"this is not gzip" * 10,
            headers={"Content-Encoding": "gzip", "Content-Type": "application/json"},
        ) as resp:
            status, text = resp.status, await resp.text()
    assert status == 400 and "invalid_body" in text, (status, text)
    assert not tracebacks.found, tracebacks.found[0]


@pytest.mark.parametrize("path", ["/v1/messages", "/api/chat"])
async def test_tool_arguments_past_the_rule_from_a_backend_are_its_error(
    fake: FakeUpstream, path: str, tracebacks: Tracebacks
) -> None:
    """The doors that send a call's arguments as an object (Anthropic's ``input``, Ollama's
    ``arguments``) could not encode ones nested past orjson's 254: the backend's fault, said
    so (it was a 500 internal_error and a traceback)."""
    arguments = '{"a":' + "[" * 300 + "]" * 300 + "}"
    call = {"id": "c1", "type": "function", "function": {"name": "f", "arguments": arguments}}
    answer = {
        "id": "x",
        "object": "chat.completion",
        "created": 0,
        "model": MODEL,
        "choices": [
            {
                "index": 0,
                "finish_reason": "tool_calls",
                "message": {"role": "assistant", "content": None, "tool_calls": [call]},
            }
        ],
    }
    fake.behaviour = Behaviour(raw_body=orjson.dumps(answer))
    body = {"model": MODEL, "messages": ASK, "stream": False}
    if path == "/v1/messages":
        body["max_tokens"] = 4
    async with (
        run_router(router_settings(fake)) as r,
        aiohttp.ClientSession() as s,
        s.post(r.url + path, json=body) as resp,
    ):
        status, headers, text = resp.status, resp.headers, await resp.text()
    assert status in (500, 502) and headers["X-Speclane-Error-Source"] == "upstream", text
    assert "upstream_bad_tool_call" in text
    assert not tracebacks.found, tracebacks.found[0]
