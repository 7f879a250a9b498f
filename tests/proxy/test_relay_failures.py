"""Every way a stream can fail after its first event, on every front door.

An upstream on loopback sends a first event (so the client has a 200 and bytes), then fails
one way. Each case checks what the client sees last (an OpenAI error event then
``data: [DONE]``; Anthropic's ``event: error``; an Ollama ``{"error"}`` line), the body
ending cleanly, ``speclane_stream_errors_total{reason}``, and the request booked with that
error (and its status, never a clean 200) in the access log and on ``/admin/status``.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

import aiohttp
import orjson
import pytest

from router.proxy import relay as relay_module
from tests.conftest import RunningRouter, router_settings, run_router, wait_until
from tests.reliability.harness import metric_total
from tests.reliability.hostile_upstream import HostileUpstream, chunk

SSE_HEAD = (
    b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n"
)
HANG = 30.0  # a guard against hanging, not a speed claim
READ_TIMEOUT = 0.5


def content_event(text: str) -> bytes:
    return (
        b"data: "
        + orjson.dumps(
            {
                "id": "c",
                "object": "chat.completion.chunk",
                "created": 0,
                "model": "fake-model",
                "choices": [{"index": 0, "delta": {"content": text}, "finish_reason": None}],
            }
        )
        + b"\n\n"
    )


FIRST = SSE_HEAD + chunk(content_event("first"))


async def _forever() -> None:
    await asyncio.Event().wait()


async def stall(writer: asyncio.StreamWriter) -> bool:
    await _forever()
    return False


async def pings(writer: asyncio.StreamWriter) -> bool:
    while True:  # comments are not progress: this is a stall too
        writer.write(chunk(b": ping\n\n"))
        await writer.drain()
        await asyncio.sleep(0.05)


async def broken_framing(writer: asyncio.StreamWriter) -> bool:
    writer.write(b"zz\r\nnot a chunk\r\n")
    await writer.drain()
    await _forever()
    return False


async def too_large(writer: asyncio.StreamWriter) -> bool:
    writer.write(chunk(content_event("x" * 4096)))
    await writer.drain()
    await _forever()
    return False


async def hang_up(writer: asyncio.StreamWriter) -> bool:
    return False  # the connection closes mid-body


async def end_without_done(writer: asyncio.StreamWriter) -> bool:
    writer.write(b"0\r\n\r\n")
    await writer.drain()
    return True


async def second_event(writer: asyncio.StreamWriter) -> bool:
    writer.write(chunk(content_event("second")))
    await writer.drain()
    await _forever()
    return False


UPSTREAM_ERROR = (
    b"data: "
    + orjson.dumps({"error": {"message": "out of memory", "type": "server_error", "code": 500}})
    + b"\n\n"
)


async def error_event_then_done(writer: asyncio.StreamWriter) -> bool:
    writer.write(chunk(UPSTREAM_ERROR) + chunk(b"data: [DONE]\n\n") + b"0\r\n\r\n")
    await writer.drain()
    return True


async def error_event_then_end(writer: asyncio.StreamWriter) -> bool:
    writer.write(chunk(UPSTREAM_ERROR) + b"0\r\n\r\n")
    await writer.drain()
    return True


@dataclass(frozen=True)
class Case:
    then: Callable[[asyncio.StreamWriter], Awaitable[bool]]
    status: int  # booked in the access log
    code: str


CASES = {
    "timeout": Case(stall, 504, "upstream_timeout"),
    "timeout_pings": Case(pings, 504, "upstream_timeout"),
    "malformed": Case(broken_framing, 502, "upstream_malformed"),
    "too_large": Case(too_large, 502, "upstream_too_large"),
    "disconnect": Case(hang_up, 502, "upstream_error"),
    "no_done": Case(end_without_done, 502, "upstream_incomplete_stream"),
    "shutdown": Case(stall, 503, "shutting_down"),
    "internal": Case(second_event, 500, "internal_error"),
    # The upstream's own error event, passed on: the client's ending is that error.
    "upstream_error": Case(error_event_then_done, 500, "500"),
    "upstream_error_no_done": Case(error_event_then_end, 500, "500"),
}

DOORS = {
    "openai": (
        "/v1/chat/completions",
        {"stream": True, "messages": [{"role": "user", "content": "hi"}]},
    ),
    "anthropic": (
        "/v1/messages",
        {"stream": True, "max_tokens": 16, "messages": [{"role": "user", "content": "hi"}]},
    ),
    "ollama": ("/api/chat", {"messages": [{"role": "user", "content": "hi"}]}),
}


def ending(door: str, raw: bytes) -> tuple[str, str]:
    """(error code or type, message) of the error that ends the body, in the door's shape;
    fails if the body does not end with one."""
    if door == "ollama":
        last = orjson.loads(raw.strip().split(b"\n")[-1])
        assert set(last) == {"error"}, raw[-300:]
        return last["error"].split("]")[0].lstrip("["), last["error"]
    events = [e for e in raw.replace(b"\r\n", b"\n").split(b"\n\n") if e.strip()]
    if door == "anthropic":
        name, data = events[-1].split(b"\n", 1)
        assert name == b"event: error", raw[-300:]
        body = orjson.loads(data.removeprefix(b"data: "))
        assert body["type"] == "error" and set(body["error"]) == {"type", "message"}, body
        message = body["error"]["message"]
        return message.split("]")[0].lstrip("["), message
    assert events[-1] == b"data: [DONE]", raw[-300:]
    err = orjson.loads(events[-2].removeprefix(b"data: "))["error"]
    assert {"message", "type", "code"} <= set(err), err  # an upstream's own may lack param
    return err["code"], err["message"]


async def read_stream(
    r: RunningRouter, door: str, after_first: Callable[[], Awaitable[None]]
) -> tuple[int, bytes]:
    path, body = DOORS[door]
    async with (
        aiohttp.ClientSession() as s,
        s.post(f"{r.url}{path}", json={"model": "fake-model", **body}) as resp,
    ):
        first = await resp.content.readany()
        assert first, "nothing before the failure"
        await after_first()
        rest = await resp.content.read()  # raises ClientPayloadError if the body is cut
        return resp.status, first + rest


@pytest.mark.parametrize("door", sorted(DOORS))
@pytest.mark.parametrize("reason", sorted(CASES))
async def test_a_stream_failing_after_its_first_event_ends_in_the_doors_shape(
    reason: str, door: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    case = CASES[reason]
    first_seen = asyncio.Event()

    async def script(writer: asyncio.StreamWriter, body: bytes, index: int) -> bool:
        writer.write(FIRST)
        await writer.drain()
        await first_seen.wait()  # the failure comes after the first event reached the client
        return await case.then(writer)

    if reason == "internal":
        # A defect in the relay itself (what the missing argument of issue 24 was): the
        # second event meets something nobody planned for.
        real = relay_module.split_events

        def faulty(data: bytes) -> tuple[bytes, bytes]:
            if b"second" in data:
                raise RuntimeError("a relay defect")
            return real(data)

        monkeypatch.setattr(relay_module, "split_events", faulty)

    async with HostileUpstream(script) as up:
        settings = router_settings(up, upstream={"max_body_bytes": 1024})
        backends = tuple(
            b.model_copy(update={"read_timeout": READ_TIMEOUT}) for b in settings.backends
        )
        settings = settings.model_copy(
            update={
                "backends": backends,
                "retry": settings.retry.model_copy(update={"attempts": 1}),
            }
        )
        async with run_router(settings) as r:

            async def after_first() -> None:
                first_seen.set()
                if reason == "shutdown":
                    await r.services.relay.shutdown(0.0)

            status, raw = await asyncio.wait_for(read_stream(r, door, after_first), HANG)
            assert status == 200
            code, _ = ending(door, raw)
            assert str(code) == case.code, raw[-400:]

            label = reason.removesuffix("_pings").removesuffix("_no_done")
            async with aiohttp.ClientSession() as s:
                assert (
                    await metric_total(s, r.url, "speclane_stream_errors_total", reason=label) == 1
                )
                assert await metric_total(s, r.url, "speclane_stream_errors_total") == 1
                access = r.services.access.recent
                await wait_until(lambda: len(access) == 1)
                record = access[-1]
                assert record.status == case.status and record.stream
                assert record.error is not None and record.error.startswith(f"{case.code}: "), (
                    record.error
                )
                async with s.get(f"{r.url}/admin/status") as resp:
                    [shown] = (await resp.json())["recent"]
                assert (shown["status"], shown["error"]) == (case.status, record.error)
                assert (
                    await metric_total(s, r.url, "speclane_requests_total", status=str(case.status))
                    == 1
                )
                assert await metric_total(s, r.url, "speclane_requests_total", status="200") == 0
