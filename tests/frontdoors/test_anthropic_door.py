"""POST /v1/messages through the official anthropic SDK, against loopback fake upstreams."""

from __future__ import annotations

from pathlib import Path

import aiohttp
import anthropic
import pytest

from tests.conftest import lanes_router, metric_value, router_settings, run_router
from tests.fakes.upstream import Behaviour, FakeUpstream, fake_upstream
from tests.frontdoors.conftest import TOOL_ARGS, tool_call_body, tool_call_stream

MODEL = "fake-model"
HELLO = [{"role": "user", "content": "Hello"}]
TOOLS = [
    {
        "name": "get_weather",
        "description": "Weather in a city",
        "input_schema": {
            "type": "object",
            "properties": {"city": {"type": "string"}, "days": {"type": "integer"}},
        },
    }
]


def sdk(url: str, **kw: object) -> anthropic.AsyncAnthropic:
    kw.setdefault("api_key", "test-key")
    return anthropic.AsyncAnthropic(base_url=url, max_retries=0, timeout=30, **kw)  # type: ignore[arg-type]


async def test_message_on_the_lane_the_header_asks_for() -> None:
    async with (
        fake_upstream(name="spec") as spec,
        fake_upstream(name="batch") as batch,
        lanes_router(spec, batch) as r,
    ):
        async with sdk(r.url) as client:
            raw = await client.messages.with_raw_response.create(
                model=MODEL,
                max_tokens=16,
                system=[{"type": "text", "text": "Be brief."}],
                messages=HELLO,
                stop_sequences=["END"],
                extra_body={"temperature": 0.5, "top_k": 5},  # this SDK has no such kwargs
                extra_headers={"X-Speclane-Lane": "batching"},
            )
            message = await raw.parse()
    assert raw.headers["x-speclane-lane"] == "batching"
    assert raw.headers["x-speclane-decision"]
    assert not spec.requests and len(batch.requests) == 1
    sent = batch.requests[0].body
    assert sent["messages"] == [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Hello"},
    ]
    assert (sent["max_tokens"], sent["stop"], sent["temperature"], sent["top_k"]) == (
        16,
        ["END"],
        0.5,
        5,
    )
    assert message.content[0].type == "text" and message.content[0].text == "w0 w1 w2 w3 w4"
    assert message.stop_reason == "end_turn" and message.model == MODEL
    assert (message.usage.input_tokens, message.usage.output_tokens) == (7, 5)


async def test_streamed_message_has_anthropics_event_sequence(fake: FakeUpstream) -> None:
    async with run_router(router_settings(fake)) as r, sdk(r.url) as client:
        async with client.messages.stream(model=MODEL, max_tokens=16, messages=HELLO) as stream:
            kinds = [event.type async for event in stream]
            final = await stream.get_final_message()
        async with aiohttp.ClientSession() as s, s.get(f"{r.url}/metrics") as resp:
            metrics = await resp.text()
    assert kinds[0] == "message_start"
    assert kinds[-2:] == ["message_delta", "message_stop"]
    assert "content_block_start" in kinds and "content_block_stop" in kinds
    assert fake.requests[0].body["stream_options"] == {
        "include_usage": True,
        "continuous_usage_stats": True,
    }
    assert final.content[0].text == "w0 w1 w2 w3 w4 "
    assert final.stop_reason == "end_turn" and final.usage.output_tokens == 5
    assert metric_value(metrics, "speclane_requests_total", api="anthropic", status="200") == 1


async def test_ping_follows_message_start(fake: FakeUpstream) -> None:
    async with run_router(router_settings(fake)) as r, aiohttp.ClientSession() as s:
        body = {"model": MODEL, "max_tokens": 8, "messages": HELLO, "stream": True}
        async with s.post(f"{r.url}/v1/messages", json=body) as resp:
            text = await resp.text()
            assert resp.headers["Content-Type"].startswith("text/event-stream")
    names = [ln.removeprefix("event: ") for ln in text.splitlines() if ln.startswith("event:")]
    assert names[:3] == ["message_start", "ping", "content_block_start"]
    assert "data: [DONE]" not in text


@pytest.mark.parametrize("stream", [False, True], ids=["json", "stream"])
async def test_tool_round_trip(fake: FakeUpstream, stream: bool) -> None:
    fake.then(tool_call_stream() if stream else tool_call_body(), Behaviour())
    async with run_router(router_settings(fake)) as r, sdk(r.url) as client:
        kwargs = {
            "model": MODEL,
            "max_tokens": 64,
            "messages": HELLO,
            "tools": TOOLS,
            "tool_choice": {"type": "any"},
        }
        if stream:
            async with client.messages.stream(**kwargs) as s:  # type: ignore[arg-type]
                first = await s.get_final_message()
        else:
            first = await client.messages.create(**kwargs)  # type: ignore[arg-type]
        assert first.stop_reason == "tool_use"
        use = next(b for b in first.content if b.type == "tool_use")
        assert use.name == "get_weather" and use.input == TOOL_ARGS
        if stream:
            assert first.content[0].type == "text" and first.content[0].text == "Let me check."
        second = await client.messages.create(
            model=MODEL,
            max_tokens=64,
            tools=TOOLS,  # type: ignore[arg-type]
            messages=[
                *HELLO,
                {"role": "assistant", "content": first.content},  # type: ignore[list-item]
                {
                    "role": "user",
                    "content": [
                        {"type": "tool_result", "tool_use_id": use.id, "content": "sunny"},
                        {"type": "text", "text": "Thanks"},
                    ],
                },
            ],
        )
    sent = fake.requests[0].body
    assert sent["tools"][0]["function"]["name"] == "get_weather"
    assert sent["tool_choice"] == "required"
    follow = fake.requests[1].body["messages"]
    call = follow[1]["tool_calls"][0]
    assert (call["id"], call["function"]["name"]) == (use.id, "get_weather")
    assert follow[2] == {"role": "tool", "tool_call_id": use.id, "content": "sunny"}
    assert follow[3] == {"role": "user", "content": "Thanks"}
    assert second.stop_reason == "end_turn"


async def test_upstream_error_mid_stream_is_an_error_event() -> None:
    async with (
        fake_upstream(behaviour=Behaviour(die_after=2)) as fake,
        run_router(router_settings(fake, retry={"attempts": 1})) as r,
        aiohttp.ClientSession() as s,
    ):
        body = {"model": MODEL, "max_tokens": 8, "messages": HELLO, "stream": True}
        async with s.post(f"{r.url}/v1/messages", json=body) as resp:
            text = await resp.text()
    assert 'event: error\ndata: {"type":"error","error":{"type":"api_error"' in text
    assert "message_stop" not in text


async def test_refusals_in_anthropics_shape(fake: FakeUpstream) -> None:
    async with run_router(router_settings(fake)) as r, sdk(r.url) as client:
        with pytest.raises(anthropic.NotFoundError) as missing:
            await client.messages.create(model="no-such-model", max_tokens=8, messages=HELLO)
        with pytest.raises(anthropic.BadRequestError):
            await client.messages.create(
                model=MODEL,
                max_tokens=8,
                messages=[{"role": "user", "content": [{"type": "document", "source": {}}]}],
            )  # type: ignore[list-item]
        async with aiohttp.ClientSession() as s:  # the SDK itself refuses a missing max_tokens
            async with s.post(
                f"{r.url}/v1/messages", json={"model": MODEL, "messages": HELLO}
            ) as resp:
                no_max = (resp.status, await resp.json())
    assert missing.value.body["type"] == "error"  # type: ignore[index]
    assert missing.value.body["error"]["type"] == "not_found_error"  # type: ignore[index]
    assert no_max[0] == 400 and no_max[1]["error"]["type"] == "invalid_request_error"
    assert "max_tokens" in no_max[1]["error"]["message"]
    assert not fake.requests


POLICIES = {
    "default.toml": 'require_api_key = true\n[match]\napi_keys = ["house-key"]\n',
    "narrow.toml": (
        'require_api_key = true\n[match]\napi_keys = ["narrow-key"]\n'
        '[models]\nallow = ["other-*"]\n'
    ),
}


async def test_policies_apply_to_either_key_header(fake: FakeUpstream, tmp_path: Path) -> None:
    for name, text in POLICIES.items():
        (tmp_path / name).write_text(text)
    async with run_router(router_settings(fake, policies_dir=str(tmp_path))) as r:
        async with sdk(r.url, api_key="wrong") as client:
            with pytest.raises(anthropic.AuthenticationError):
                await client.messages.create(model=MODEL, max_tokens=8, messages=HELLO)
        async with sdk(r.url, api_key="narrow-key") as client:
            with pytest.raises(anthropic.PermissionDeniedError):
                await client.messages.create(model=MODEL, max_tokens=8, messages=HELLO)
        async with sdk(r.url, api_key="house-key") as client:  # x-api-key
            ok = await client.messages.create(model=MODEL, max_tokens=8, messages=HELLO)
        async with sdk(r.url, api_key=None, auth_token="house-key") as client:  # Bearer
            raw = await client.messages.with_raw_response.create(
                model=MODEL,
                max_tokens=8,
                messages=HELLO,
                extra_headers={"anthropic-version": "2023-06-01"},
            )
    assert ok.content[0].text and raw.headers["x-speclane-client"] == "default"


async def test_image_is_refused_by_a_text_lane(fake: FakeUpstream) -> None:
    """The image goes to the backend as an OpenAI image part; the MLX worker refuses those
    with a 400 (tests/frontdoors/test_real_lanes.py), which reaches the client as Anthropic's
    invalid_request_error."""
    fake.then(
        Behaviour(status=400, error_message="messages[0].content: only text parts are supported")
    )
    image = {
        "type": "image",
        "source": {"type": "base64", "media_type": "image/png", "data": "iVBORw0KGgo="},
    }
    async with run_router(router_settings(fake)) as r, sdk(r.url) as client:
        with pytest.raises(anthropic.BadRequestError) as refused:
            await client.messages.create(
                model=MODEL,
                max_tokens=8,
                messages=[{"role": "user", "content": [image, {"type": "text", "text": "what?"}]}],
            )
    part = fake.requests[0].body["messages"][0]["content"][0]
    assert part["image_url"]["url"] == "data:image/png;base64,iVBORw0KGgo="
    assert "only text parts" in refused.value.message
