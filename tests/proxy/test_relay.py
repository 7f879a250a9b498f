"""The proxy core end to end: the official openai client -> speclane -> fake upstreams."""

from __future__ import annotations

import asyncio
import time

import aiohttp
import openai
import orjson
import pytest

from router.backends.base import Backend
from router.backends.cooldown import Cooldown
from router.backends.health import check_once
from router.proxy.relay import upstream_body
from router.proxy.request import parse_request
from router.routing.types import Candidate
from tests.conftest import fake_upstreams, router_settings, run_router, wait_until
from tests.fakes.upstream import Behaviour, FakeUpstream

CHAT = [{"role": "user", "content": "hi"}]


async def test_chat_non_streaming_passes_the_body_through(fake: FakeUpstream) -> None:
    fake.behaviour = Behaviour(chunks=3, body_extra={"stats": {"total_draft_tokens_count": 9}})
    async with run_router(router_settings(fake)) as r:
        raw = await r.client().chat.completions.with_raw_response.create(
            model="fake-model", messages=CHAT
        )
        completion = raw.parse()
    assert completion.choices[0].message.content == "w0 w1 w2"
    assert completion.usage is not None and completion.usage.completion_tokens == 3
    # unknown top-level fields survive: the body was not re-serialised through a schema
    assert orjson.loads(raw.content)["stats"] == {"total_draft_tokens_count": 9}
    assert raw.headers["x-speclane-backend"] == "fake"
    assert raw.headers["x-speclane-lane"] == "fake"
    assert raw.headers["x-speclane-decision"] == "preset=none,external->fake"
    assert raw.headers["x-speclane-client"] == "default"
    assert float(raw.headers["x-speclane-overhead-ms"]) >= 0
    assert fake.requests[0].body["messages"] == CHAT


async def test_chat_streaming_relays_every_chunk_and_done(fake: FakeUpstream) -> None:
    fake.behaviour = Behaviour(chunks=4)
    async with run_router(router_settings(fake)) as r:
        stream = await r.client().chat.completions.create(
            model="fake-model", messages=CHAT, stream=True, stream_options={"include_usage": True}
        )
        parts, usage = [], None
        async for chunk in stream:
            if chunk.choices:
                parts.append(chunk.choices[0].delta.content or "")
            if chunk.usage:
                usage = chunk.usage
    assert "".join(parts) == "w0 w1 w2 w3 "
    assert usage is not None and usage.completion_tokens == 4


async def test_stream_headers_forbid_buffering(fake: FakeUpstream) -> None:
    async with run_router(router_settings(fake)) as r, aiohttp.ClientSession() as s:
        body = {"model": "fake-model", "messages": CHAT, "stream": True}
        async with s.post(f"{r.base_url}/chat/completions", json=body) as resp:
            text = await resp.text()
            assert resp.headers["X-Accel-Buffering"] == "no"
            assert resp.headers["Content-Type"].startswith("text/event-stream")
    assert text.endswith("data: [DONE]\n\n")


async def test_chunks_arrive_as_the_upstream_sends_them(fake: FakeUpstream) -> None:
    """No buffering: the first content chunk reaches the client long before the last."""
    fake.behaviour = Behaviour(chunks=5, interval=0.3)
    async with run_router(router_settings(fake)) as r:
        stream = await r.client().chat.completions.create(
            model="fake-model", messages=CHAT, stream=True
        )
        arrivals = []
        async for _ in stream:
            arrivals.append(time.monotonic())
    # 5 intervals of 0.3 s: a buffering proxy would deliver everything within a few ms.
    assert arrivals[-1] - arrivals[1] > 0.9


async def test_completions_streaming_and_not(fake: FakeUpstream) -> None:
    async with run_router(router_settings(fake)) as r:
        client = r.client()
        done = await client.completions.create(model="fake-model", prompt="say", max_tokens=5)
        assert done.choices[0].text == "w0 w1 w2 w3 w4"
        stream = await client.completions.create(model="fake-model", prompt="say", stream=True)
        text = "".join([c.choices[0].text async for c in stream if c.choices])
    assert text == "w0 w1 w2 w3 w4 "
    assert fake.requests[0].path == "/v1/completions"


async def test_embeddings(fake: FakeUpstream) -> None:
    async with run_router(router_settings(fake)) as r:
        result = await r.client().embeddings.create(model="fake-model", input=["a", "b"])
    assert [d.embedding for d in result.data] == [[0.1, 0.2, 0.3]] * 2


async def test_models_is_the_union_over_healthy_backends() -> None:
    async with fake_upstreams("a", "b", "c") as (a, b, c):
        a.models, b.models, c.models = ("m1", "shared"), ("m2", "shared"), ("m3",)
        c.models_status = 500  # unhealthy: its models are not listed
        async with run_router(router_settings(a, b, c)) as r:
            models = await r.client().models.list()
    ids = [m.id for m in models.data]
    assert ids == ["m1", "m2", "shared"]


async def test_request_goes_to_a_backend_serving_its_model() -> None:
    async with fake_upstreams("a", "b") as (a, b):
        a.models, b.models = ("alpha",), ("beta",)
        async with run_router(router_settings(a, b)) as r:
            await r.client().chat.completions.create(model="beta", messages=CHAT)
    assert not a.requests and len(b.requests) == 1


async def test_least_busy_backend_is_chosen() -> None:
    async with fake_upstreams("a", "b") as (a, b):
        a.behaviour = Behaviour(chunks=2, stall_after=1)
        async with run_router(router_settings(a, b)) as r:
            client = r.client()
            first = await client.chat.completions.create(
                model="fake-model", messages=CHAT, stream=True
            )
            await anext(first.__aiter__())  # "a" (first by name) now holds one in-flight stream
            second = await client.chat.completions.create(model="fake-model", messages=CHAT)
            await first.close()
    assert second.choices[0].message.content
    assert len(a.requests) == 1 and len(b.requests) == 1


async def test_healthz_and_readyz() -> None:
    async with fake_upstreams("a") as (a,):
        a.models_status = 500
        async with run_router(router_settings(a)) as r, aiohttp.ClientSession() as s:
            async with s.get(f"{r.url}/healthz") as resp:
                assert resp.status == 200
            async with s.get(f"{r.url}/readyz") as resp:
                assert resp.status == 503
                assert (await resp.json())["error"]["code"] == "not_ready"
            a.models_status = 200
            await check_once(
                r.services.started.client_session(), r.services.pool["a"], r.services.metrics
            )
            async with s.get(f"{r.url}/readyz") as resp:
                assert resp.status == 200


# --- failures before the first byte: retried -----------------------------------------------


async def test_5xx_is_retried_on_the_next_candidate() -> None:
    async with fake_upstreams("a", "b") as (a, b):
        a.behaviour = Behaviour(status=503)
        async with run_router(router_settings(a, b)) as r:
            raw = await r.client().chat.completions.with_raw_response.create(
                model="fake-model", messages=CHAT
            )
    assert raw.headers["x-speclane-backend"] == "b"
    assert raw.headers["x-speclane-attempts"] == "2"
    assert len(a.requests) == 1


async def test_connection_refused_is_retried() -> None:
    async with fake_upstreams("b") as (b,):
        settings = router_settings(b)
        dead = {
            "name": "a",
            "kind": "openai",
            "base_url": "http://127.0.0.1:9/v1",
            "models": ["fake-model"],
            "connect_timeout": 1,
        }
        settings = router_settings(b, backends=[dead, *[x.model_dump() for x in settings.backends]])
        async with run_router(settings) as r:
            r.services.pool["a"].ready = True  # pretend healthy
            raw = await r.client().chat.completions.with_raw_response.create(
                model="fake-model", messages=CHAT
            )
    assert raw.headers["x-speclane-backend"] == "b"


async def test_stream_that_dies_before_its_first_byte_is_retried() -> None:
    async with fake_upstreams("a", "b") as (a, b):
        a.behaviour = Behaviour(raw_body=b"")  # headers, then closes with no data
        async with run_router(router_settings(a, b)) as r:
            stream = await r.client().chat.completions.create(
                model="fake-model", messages=CHAT, stream=True
            )
            text = "".join([c.choices[0].delta.content or "" async for c in stream if c.choices])
    assert text == "w0 w1 w2 w3 w4 "
    assert len(a.requests) == 1 and len(b.requests) == 1


async def test_retries_are_bounded_and_keep_the_upstream_error(fake: FakeUpstream) -> None:
    fake.behaviour = Behaviour(status=500, error_message="model exploded")
    async with run_router(router_settings(fake)) as r:
        with pytest.raises(openai.InternalServerError) as info:
            await r.client().chat.completions.create(model="fake-model", messages=CHAT)
    assert len(fake.requests) == 3  # retry.attempts
    assert info.value.status_code == 500
    assert "model exploded" in info.value.message
    assert info.value.response.headers["x-speclane-error-source"] == "upstream"


async def test_4xx_from_upstream_is_not_retried_and_keeps_status(fake: FakeUpstream) -> None:
    fake.behaviour = Behaviour(status=400, error_message="context too long")
    async with run_router(router_settings(fake)) as r:
        with pytest.raises(openai.BadRequestError) as info:
            await r.client().chat.completions.create(model="fake-model", messages=CHAT)
    assert len(fake.requests) == 1
    assert "context too long" in info.value.message


async def test_repeated_failures_cool_a_backend_down() -> None:
    async with fake_upstreams("a", "b") as (a, b):
        a.behaviour = Behaviour(status=502)
        settings = router_settings(a, b, cooldown={"allowed_fails": 2, "seconds": 60})
        async with run_router(settings) as r:
            client = r.client()
            for _ in range(4):
                await client.chat.completions.create(model="fake-model", messages=CHAT)
            assert r.services.pool["a"].view().cooled_down
    # a was tried until it was cooled down (2 failures), then skipped
    assert len(a.requests) == 2 and len(b.requests) == 4


# --- failures after the first byte: an error event, never a retry ----------------------------


async def read_sse(base_url: str, body: dict) -> tuple[int, list[bytes]]:
    url = f"{base_url}/chat/completions"
    async with aiohttp.ClientSession() as s, s.post(url, json=body) as resp:
        raw = await resp.read()
    events = [e[6:] for e in raw.split(b"\n\n") if e.startswith(b"data: ")]
    return resp.status, events


async def test_backend_dying_mid_stream_ends_with_an_error_event(fake: FakeUpstream) -> None:
    fake.behaviour = Behaviour(chunks=5, die_after=2)
    async with run_router(router_settings(fake)) as r:
        status, events = await read_sse(
            r.base_url, {"model": "fake-model", "messages": CHAT, "stream": True}
        )
    assert status == 200
    assert events[-1] == b"[DONE]"
    err = orjson.loads(events[-2])["error"]
    assert err["type"] == "upstream_error" and "closed the stream" in err["message"]
    assert len(fake.requests) == 1  # never retried after bytes were sent


async def test_openai_client_raises_on_the_error_event(fake: FakeUpstream) -> None:
    fake.behaviour = Behaviour(chunks=5, die_after=2)
    async with run_router(router_settings(fake)) as r:
        stream = await r.client().chat.completions.create(
            model="fake-model", messages=CHAT, stream=True
        )
        with pytest.raises(openai.APIError, match="closed the stream"):
            async for _ in stream:
                pass


async def test_stall_mid_stream_ends_with_timeout_event_within_read_timeout() -> None:
    async with fake_upstreams("a") as (a,):
        a.behaviour = Behaviour(chunks=5, stall_after=1)
        settings = router_settings(a)
        backend = settings.backends[0].model_copy(update={"read_timeout": 0.5})
        async with run_router(router_settings(a, backends=[backend.model_dump()])) as r:
            start = time.monotonic()
            _, events = await read_sse(
                r.base_url, {"model": "fake-model", "messages": CHAT, "stream": True}
            )
            elapsed = time.monotonic() - start
        assert a.cancelled == 1  # the stalled upstream request was closed
    assert elapsed < 3
    assert orjson.loads(events[-2])["error"]["code"] == "upstream_timeout"


async def test_keep_alive_comments_alone_do_not_keep_a_stalled_stream_open() -> None:
    async with fake_upstreams("a") as (a,):
        a.behaviour = Behaviour(chunks=5, stall_after=1, ping_every=0.05)
        backend = router_settings(a).backends[0].model_copy(update={"read_timeout": 0.5})
        async with run_router(router_settings(a, backends=[backend.model_dump()])) as r:
            start = time.monotonic()
            _, events = await read_sse(
                r.base_url, {"model": "fake-model", "messages": CHAT, "stream": True}
            )
            elapsed = time.monotonic() - start
            await wait_until(lambda: a.cancelled == 1)  # the stalled upstream request was closed
    assert elapsed < 3
    error = orjson.loads(events[-2])["error"]
    assert error["code"] == "upstream_timeout" and "keep-alive" in error["message"]


async def test_stall_before_headers_is_a_504() -> None:
    async with fake_upstreams("a") as (a,):
        a.behaviour = Behaviour(delay_headers=30)
        backend = router_settings(a).backends[0].model_copy(update={"read_timeout": 0.5})
        async with run_router(router_settings(a, backends=[backend.model_dump()])) as r:
            with pytest.raises(openai.APIStatusError) as info:
                await r.client().chat.completions.create(model="fake-model", messages=CHAT)
    assert info.value.status_code == 504
    assert len(a.requests) == 1  # timeouts are not retried


async def test_stream_closed_without_done_gets_an_error_event(fake: FakeUpstream) -> None:
    fake.behaviour = Behaviour(no_done=True)
    async with run_router(router_settings(fake)) as r:
        _, events = await read_sse(
            r.base_url, {"model": "fake-model", "messages": CHAT, "stream": True}
        )
    assert orjson.loads(events[-2])["error"]["code"] == "upstream_incomplete_stream"
    assert events[-1] == b"[DONE]"


@pytest.mark.parametrize(
    ("behaviour", "code"),
    [
        (Behaviour(raw_body=b"<html>oops</html>", content_type="text/html"), "upstream_bad_json"),
        (
            Behaviour(raw_body=b'{"choices": [', content_type="application/json"),
            "upstream_bad_json",
        ),
    ],
)
async def test_malformed_non_streaming_body_is_a_502(
    fake: FakeUpstream, behaviour: Behaviour, code: str
) -> None:
    fake.behaviour = behaviour
    async with run_router(router_settings(fake)) as r, aiohttp.ClientSession() as s:
        async with s.post(
            f"{r.base_url}/chat/completions", json={"model": "fake-model", "messages": CHAT}
        ) as resp:
            assert resp.status == 502
            assert (await resp.json())["error"]["code"] == code


@pytest.mark.parametrize(
    "behaviour",
    [
        Behaviour(raw_body=b"hello, this is not SSE\n\n"),
        Behaviour(content_type="application/json"),
    ],
)
async def test_bad_stream_framing_is_a_502(fake: FakeUpstream, behaviour: Behaviour) -> None:
    fake.behaviour = behaviour
    async with run_router(router_settings(fake)) as r, aiohttp.ClientSession() as s:
        body = {"model": "fake-model", "messages": CHAT, "stream": True}
        async with s.post(f"{r.base_url}/chat/completions", json=body) as resp:
            assert resp.status == 502
            assert (await resp.json())["error"]["code"] == "upstream_bad_stream"


# --- the client going away -----------------------------------------------------------------


async def test_client_disconnect_mid_stream_cancels_upstream(fake: FakeUpstream) -> None:
    fake.behaviour = Behaviour(chunks=1000, interval=0.05)
    async with run_router(router_settings(fake)) as r:
        async with aiohttp.ClientSession() as s:
            body = {"model": "fake-model", "messages": CHAT, "stream": True}
            async with s.post(f"{r.base_url}/chat/completions", json=body) as resp:
                await resp.content.readany()
        await asyncio.wait_for(fake.request_cancelled.wait(), 5)
        await wait_until(lambda: r.services.pool["fake"].inflight == 0)


async def test_client_disconnect_while_waiting_non_streaming_cancels_upstream(
    fake: FakeUpstream,
) -> None:
    fake.behaviour = Behaviour(delay_headers=30)
    async with run_router(router_settings(fake)) as r:
        async with aiohttp.ClientSession() as s:
            task = asyncio.create_task(
                s.post(
                    f"{r.base_url}/chat/completions", json={"model": "fake-model", "messages": CHAT}
                )
            )
            await asyncio.wait_for(fake.request_started.wait(), 5)
            task.cancel()
        await asyncio.wait_for(fake.request_cancelled.wait(), 5)


# --- a client's fault is never a backend's (issue #44 class 2) -------------------------------


async def test_a_lanes_500_is_answered_once_and_never_cools_the_lane_down(
    fake: FakeUpstream,
) -> None:
    """A lane's 500 is a defect for that one request (the worker checked it first): not
    retried on the same code and model, and not counted towards the cooldown, so no client's
    requests can keep the lane away from the others."""
    fake.behaviour = Behaviour(status=500, error_message="internal error in the lane worker")
    settings = router_settings(fake, cooldown={"allowed_fails": 2, "seconds": 60})
    async with run_router(settings) as r:
        r.services.pool["fake"].lane = "batching"
        for _ in range(6):
            with pytest.raises(openai.InternalServerError):
                await r.client().chat.completions.create(model="fake-model", messages=CHAT)
        assert not r.services.pool["fake"].view().cooled_down
        fake.behaviour = Behaviour()
        reply = await r.client().chat.completions.create(model="fake-model", messages=CHAT)
    assert reply.choices[0].message.content
    assert len(fake.requests) == 7  # one attempt each


@pytest.mark.parametrize("status", [500, 429])
async def test_500s_and_429s_are_retried_but_never_cool_a_backend_down(status: int) -> None:
    async with fake_upstreams("a", "b") as (a, b):
        a.behaviour = Behaviour(status=status)
        settings = router_settings(a, b, cooldown={"allowed_fails": 2, "seconds": 60})
        async with run_router(settings) as r:
            for _ in range(4):
                await r.client().chat.completions.create(model="fake-model", messages=CHAT)
            assert not r.services.pool["a"].view().cooled_down
    assert len(b.requests) == 4
    assert len(a.requests) >= 2  # tried past allowed_fails, and still not cooled down


def test_each_backend_gets_its_own_body() -> None:
    """A lane: the chosen draft source, or ``num_draft_tokens: 0`` when it decodes plainly;
    an external backend: the body as validated, late system messages folded if set to."""
    messages = [
        {"role": "user", "content": "hi"},
        {"role": "system", "content": "be brief"},
        {"role": "user", "content": "again"},
    ]
    parsed = parse_request("chat", orjson.dumps({"model": "m", "messages": messages}))
    cooldown = Cooldown(allowed_fails=3, seconds=5)
    lane = Backend("speculative", "speclane", "http://x/v1", cooldown, lane="speculative")
    drafting = Candidate("speculative", "speculative", True, "prompt_lookup")
    asked = orjson.loads(upstream_body(parsed, lane, drafting))
    assert asked["draft_source"] == "prompt_lookup" and "num_draft_tokens" not in asked
    plain = Candidate("speculative", "speculative", False, "prompt_lookup")
    assert orjson.loads(upstream_body(parsed, lane, plain))["num_draft_tokens"] == 0
    external = Backend("lms", "lmstudio", "http://x/v1", cooldown, fold_system=True)
    folded = orjson.loads(upstream_body(parsed, external, Candidate("lms", "lms")))
    assert "draft_source" not in folded and "num_draft_tokens" not in folded
    assert [m["role"] for m in folded["messages"]] != [m["role"] for m in messages]
    as_sent = Backend("oai", "openai", "http://x/v1", cooldown)
    assert orjson.loads(upstream_body(parsed, as_sent, Candidate("oai", "oai"))) == {
        "model": "m",
        "messages": messages,
    }
