"""A client that closes on ``data: [DONE]`` gets a 200 and its statistics are counted.

The upstream replays real llama-server bytes (draft statistics on the finish chunk) and
sends the end of its body a moment after ``[DONE]``, in a separate write; the client closes
as soon as it has read ``[DONE]``. Every stream must be booked as a 200 with its draft
counts, never as a 499 or a client disconnect (issue 16, issue 20's false 499s).
"""

from __future__ import annotations

import asyncio
from typing import Any

import aiohttp
import orjson
import pytest

from router.proxy import relay
from tests.conftest import RunningRouter, metric_value, router_settings, run_router, wait_until
from tests.fakes.replay import Capture, ReplayUpstream, load

# llama-server with a Q2_K draft, streaming without include_usage: timings on the finish
# chunk, draft_n 36, draft_n_accepted 30 (see the fixtures' README).
LLAMACPP_STREAM = "llamacpp-server_draftQ2K_chat_stream_no-include-usage.http"
DRAFTED, ACCEPTED = 36, 30
RUNS = 30
BODY = {
    "model": "smollm2",
    "messages": [{"role": "user", "content": "count"}],
    "stream": True,
    "max_tokens": 20,
}


def replay(gap: float) -> ReplayUpstream:
    return ReplayUpstream(
        load(LLAMACPP_STREAM),
        tail_gap=gap,
        gets={"/v1/models": load("llamacpp-server_v1-models.json")},
    )


def settings(up: ReplayUpstream) -> Any:
    return router_settings(
        backends=[
            {
                "name": "llama",
                "kind": "llamacpp",
                "base_url": up.base_url,
                "models": ["smollm2"],
                "speculative": True,
                "read_timeout": 5,
                "connect_timeout": 2,
            }
        ]
    )


async def raw_close_on_done(r: RunningRouter) -> bytes:
    """POST a stream over a plain socket; close it the moment [DONE] has been read."""
    reader, writer = await asyncio.open_connection("127.0.0.1", r.port)
    body = orjson.dumps(BODY)
    writer.write(
        b"POST /v1/chat/completions HTTP/1.1\r\nHost: localhost\r\n"
        b"Content-Type: application/json\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body)
    )
    seen = b""
    async with asyncio.timeout(10):
        while b"\ndata: [DONE]" not in seen:  # at a line start, not inside content
            chunk = await reader.read(65536)
            assert chunk, "the router closed before [DONE]"
            seen += chunk
            assert seen[:12] in (b"HTTP/1.1 200", b"HTTP/1.1"[: len(seen)]), seen
    writer.transport.abort()  # no FIN dance: gone at once, as a process that exits
    return seen


async def sdk_stream(r: RunningRouter) -> str:
    client = r.client()
    stream = await client.chat.completions.create(**BODY)
    text = ""
    async for chunk in stream:
        if chunk.choices and chunk.choices[0].delta.content:
            text += chunk.choices[0].delta.content
    return text


async def booked(r: RunningRouter, runs: int) -> str:
    """Wait until every request has been booked (a 200 or not); then /metrics as served."""
    metrics = r.services.metrics

    def all_booked() -> bool:
        text = metrics.render().decode()
        return (
            sum(
                v
                for status in ("200", "499")
                if (
                    v := metric_value(
                        text, "speclane_requests_total", backend="llama", status=status
                    )
                )
            )
            >= runs
        )

    await wait_until(all_booked)
    async with aiohttp.ClientSession() as s, s.get(f"{r.url}/metrics") as resp:
        assert resp.status == 200
        text = await resp.text()
    assert metric_value(text, "speclane_requests_total", backend="llama", status="200") == runs, (
        text
    )
    return text


def assert_complete(text: str, runs: int) -> None:
    assert (metric_value(text, "speclane_requests_total", status="499") or 0) == 0
    assert (metric_value(text, "speclane_client_disconnects_total", backend="llama") or 0) == 0
    assert metric_value(text, "speclane_spec_draft_tokens_total", backend="llama") == DRAFTED * runs
    assert (
        metric_value(text, "speclane_spec_accepted_tokens_total", backend="llama")
        == ACCEPTED * runs
    )


@pytest.mark.parametrize("gap", [0.0002, 0.05])
async def test_raw_client_closing_on_done_is_a_200_with_statistics(gap: float) -> None:
    runs = RUNS if gap < 0.01 else 5
    async with replay(gap) as up, run_router(settings(up)) as r:
        for _ in range(runs):
            seen = await raw_close_on_done(r)
            assert b'"draft_n":36' in seen
        assert_complete(await booked(r, runs), runs)


@pytest.mark.parametrize("gap", [0.0002, 0.3])
async def test_openai_sdk_stream_is_a_200_with_statistics(gap: float) -> None:
    # The SDK (3.x) drains the body for up to 0.1 s after [DONE], then closes: the 0.3 s
    # gap makes it close in the gap every time.
    runs = RUNS if gap < 0.01 else 3
    async with replay(gap) as up, run_router(settings(up)) as r:
        for _ in range(runs):
            assert (await sdk_stream(r)).startswith("1. 1")
        assert_complete(await booked(r, runs), runs)


@pytest.mark.parametrize(
    ("capture", "kind"),
    [
        ("llama-cpp-python-0.3.36_plain_chat_stream.http", "openai"),
        ("vllm-mlx-0.6.0_plain_chat_stream.http", "vllm_mlx"),
        ("mlxlm-0.32.2_draft3_chat_stream.http", "mlx_lm"),
        ("llamacpp-server_draftQ2K_chat_stream_include-usage.sse", "llamacpp"),
    ],
)
async def test_every_captured_stream_closed_on_done_is_a_200(capture: str, kind: str) -> None:
    runs = 10
    up = ReplayUpstream(
        load(capture),
        tail_gap=0.0002,
        gets={
            "/v1/models": load("llamacpp-server_v1-models.json"),
            "/health": Capture(200, "application/json", b'{"status": "ok"}'),
        },
    )
    async with (
        up,
        run_router(
            router_settings(
                backends=[
                    {
                        "name": "llama",
                        "kind": kind,
                        "base_url": up.base_url,
                        "models": ["smollm2"],
                        "speculative": True,
                        "read_timeout": 5,
                    }
                ]
            )
        ) as r,
    ):
        for _ in range(runs):
            await raw_close_on_done(r)
        text = await booked(r, runs)
    assert (metric_value(text, "speclane_client_disconnects_total", backend="llama") or 0) == 0
    drafted = metric_value(text, "speclane_spec_draft_tokens_total", backend="llama")
    assert drafted == (20 * runs if kind == "llamacpp" else None)  # 20 drafted per answer


async def test_done_inside_content_does_not_end_the_stream_early() -> None:
    """Only a ``data: [DONE]`` line ends a stream: a model writing that text inside its
    content does not settle the stream before its real final events."""
    chunk = {"choices": [{"index": 0, "delta": {"content": "data: [DONE]\n\ndata: [DONE]"}}]}
    final = {
        "choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}],
        "timings": {"predicted_n": 2, "draft_n": 8, "draft_n_accepted": 5},
    }
    body = b"".join(b"data: " + orjson.dumps(e) + b"\n\n" for e in (chunk, final))
    up = ReplayUpstream(
        Capture(200, "text/event-stream", body + b"data: [DONE]\n\n"),
        gets={"/v1/models": load("llamacpp-server_v1-models.json")},
    )
    async with up, run_router(settings(up)) as r:
        seen = await raw_close_on_done(r)
        text = await booked(r, 1)
    assert b'"draft_n":8' in seen
    assert metric_value(text, "speclane_spec_draft_tokens_total", backend="llama") == 8


async def test_an_upstream_that_never_ends_after_done_is_cut_and_the_stream_stays_a_200(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Hostile: after [DONE] the upstream keeps sending (comments, forever). The client
    already has everything: its answer ends within the tail grace, as a 200 with its
    statistics, and the upstream connection is dropped, not reused."""
    monkeypatch.setattr(relay, "TAIL_GRACE", 0.2)
    up = ReplayUpstream(
        load(LLAMACPP_STREAM),
        endless_tail=b": still here\n\n",
        gets={"/v1/models": load("llamacpp-server_v1-models.json")},
    )
    async with up, run_router(settings(up)) as r, aiohttp.ClientSession() as s:
        async with s.post(f"{r.base_url}/chat/completions", json=BODY) as resp:
            assert resp.status == 200
            body = await resp.read()  # ends: the router closed the body
        text = await booked(r, 1)
        await wait_until(lambda: not up.writing)
    assert body.count(b"data: [DONE]") == 1 and b'"draft_n":36' in body
    assert metric_value(text, "speclane_spec_draft_tokens_total", backend="llama") == DRAFTED


@pytest.mark.parametrize(
    ("after", "reused"),
    [
        (b'data: {"junk": 1}\n\ndata: {"error": {"message": "not yours"}}\n\n', False),
        (b"event: x\ndata: [DONE]\n\nnot sse at all\r\n", False),
        (b"data: [DONE]\n\n: bye\n\n", True),  # a repeated [DONE]: harmless
    ],
)
async def test_nothing_after_done_reaches_the_client(after: bytes, reused: bool) -> None:
    """Hostile: the upstream goes on after its data: [DONE] within the same body. The client
    gets the stream up to [DONE] and nothing else; the request is booked as the clean 200 it
    was (a later error event does not make it a failure), and a connection that carried
    anything but blank lines, comments or another [DONE] is not reused."""
    chunk = {
        "id": "c",
        "object": "chat.completion.chunk",
        "model": "smollm2",
        "choices": [{"index": 0, "delta": {"content": "hi"}, "finish_reason": "stop"}],
    }
    body = b"data: " + orjson.dumps(chunk) + b"\n\ndata: [DONE]\n\n" + after
    up = ReplayUpstream(
        Capture(200, "text/event-stream", body),
        gets={"/v1/models": load("llamacpp-server_v1-models.json")},
    )
    async with up, run_router(settings(up)) as r, aiohttp.ClientSession() as s:
        for _ in range(2):
            async with s.post(f"{r.base_url}/chat/completions", json=BODY) as resp:
                assert resp.status == 200
                got = await resp.read()
            assert got.endswith(b"data: [DONE]\n\n") and got.count(b"[DONE]") == 1, got
            assert b"junk" not in got and b"not yours" not in got
        text = await booked(r, 2)
    assert metric_value(text, "speclane_requests_total", backend="llama", status="200") == 2
    assert up.post_connections == (1 if reused else 2)
