"""Bad input and missing backends: every answer in the OpenAI error shape, right status."""

from __future__ import annotations

import aiohttp
import openai
import orjson
import pytest

from tests.conftest import router_settings, run_router
from tests.fakes.upstream import FakeUpstream

CHAT = [{"role": "user", "content": "hi"}]


async def post(url: str, data: bytes | str, **kw: object) -> tuple[int, dict, dict]:
    async with aiohttp.ClientSession() as s, s.post(url, data=data, **kw) as resp:
        return resp.status, await resp.json(), dict(resp.headers)


def assert_openai_error(body: dict) -> dict:
    err = body["error"]
    assert set(err) == {"message", "type", "param", "code"}
    assert isinstance(err["message"], str) and err["message"]
    return err


@pytest.mark.parametrize(
    ("payload", "status", "code", "param"),
    [
        (b"{not json", 400, "invalid_json", None),
        (b"", 400, "invalid_json", None),
        (b"[1, 2]", 400, "invalid_json", None),
        (b'{"messages": []}', 400, "invalid_request", "model"),
        (b'{"model": "fake-model"}', 400, "invalid_request", "messages"),
        (b'{"model": "fake-model", "messages": "hi"}', 400, "invalid_request", "messages"),
        (
            b'{"model": "fake-model", "messages": [{"content": "x"}]}',
            400,
            "invalid_request",
            "messages[0]",
        ),
        (b'{"model": 5, "messages": [{"role": "user"}]}', 400, "invalid_request", "model"),
        (
            b'{"model": "fake-model", "messages": [{"role": "user"}], "stream": "yes"}',
            400,
            "invalid_request",
            "stream",
        ),
        (
            b'{"model": "fake-model", "messages": [{"role": "user"}], "max_tokens": -1}',
            400,
            "invalid_request",
            "max_tokens",
        ),
        (
            b'{"model": "fake-model", "messages": [{"role": "user"}], "max_tokens": 1e300}',
            400,
            "invalid_request",
            "max_tokens",
        ),
        (
            b'{"model": "fake-model", "messages": [{"role": "user"}], "n": 100000}',
            400,
            "invalid_request",
            "n",
        ),
        (
            b'{"model": "fake-model", "messages": [{"role": "user"}], "temperature": 9}',
            400,
            "invalid_request",
            "temperature",
        ),
        (b'{"model": "nope", "messages": [{"role": "user"}]}', 404, "model_not_found", "model"),
    ],
)
async def test_bad_chat_requests(
    fake: FakeUpstream, payload: bytes, status: int, code: str, param: str | None
) -> None:
    async with run_router(router_settings(fake)) as r:
        got, body, headers = await post(f"{r.base_url}/chat/completions", payload)
    assert got == status
    err = assert_openai_error(body)
    assert err["code"] == code
    assert err["param"] == param
    assert headers["X-Speclane-Error-Source"] == "router"
    assert not fake.requests  # nothing bad reached the upstream


async def test_body_over_the_limit_is_413(fake: FakeUpstream) -> None:
    async with run_router(router_settings(fake, max_body_bytes=2048)) as r:
        big = orjson.dumps(
            {"model": "fake-model", "messages": [{"role": "user", "content": "x" * 4096}]}
        )
        status, body, _ = await post(f"{r.base_url}/chat/completions", big)
    assert status == 413
    assert assert_openai_error(body)["code"] == "body_too_large"


async def test_no_healthy_backend_is_503(fake: FakeUpstream) -> None:
    async with run_router(router_settings(fake)) as r:
        r.services.pool["fake"].ready = False
        with pytest.raises(openai.APIStatusError) as info:
            await r.client().chat.completions.create(model="fake-model", messages=CHAT)
    assert info.value.status_code == 503


async def test_unknown_endpoint_and_method(fake: FakeUpstream) -> None:
    async with run_router(router_settings(fake)) as r, aiohttp.ClientSession() as s:
        async with s.get(f"{r.base_url}/nothing") as resp:
            assert resp.status == 404
            assert assert_openai_error(await resp.json())["code"] == "unknown_endpoint"
        async with s.get(f"{r.base_url}/chat/completions") as resp:
            assert resp.status == 405
            assert_openai_error(await resp.json())


async def test_openai_client_sees_a_typed_error(fake: FakeUpstream) -> None:
    async with run_router(router_settings(fake)) as r:
        with pytest.raises(openai.NotFoundError, match="no backend serves model 'missing'"):
            await r.client().chat.completions.create(model="missing", messages=CHAT)


async def test_metrics_endpoint_counts_requests(fake: FakeUpstream) -> None:
    async with run_router(router_settings(fake)) as r:
        await r.client().chat.completions.create(model="fake-model", messages=CHAT)
        async with aiohttp.ClientSession() as s, s.get(f"{r.url}/metrics") as resp:
            text = await resp.text()
    assert (
        'speclane_requests_total{api="openai",backend="fake",endpoint="chat",'
        'model="fake-model",status="200"} 1.0'
    ) in text
    assert 'speclane_backend_up{backend="fake"} 1.0' in text
    assert "speclane_ttft_seconds_bucket" not in text  # streams only
    assert 'speclane_inflight_requests{backend="fake"} 0.0' in text


async def test_metrics_can_be_turned_off(fake: FakeUpstream) -> None:
    async with run_router(router_settings(fake, expose_metrics="off")) as r:
        async with aiohttp.ClientSession() as s, s.get(f"{r.url}/metrics") as resp:
            assert resp.status == 404


async def test_metrics_behind_the_admin_key(fake: FakeUpstream) -> None:
    settings = router_settings(fake, expose_metrics="admin", admin_key="s3cret")
    async with run_router(settings) as r, aiohttp.ClientSession() as s:
        async with s.get(f"{r.url}/metrics") as resp:
            assert resp.status == 401
        async with s.get(f"{r.url}/metrics", headers={"Authorization": "Bearer nope"}) as resp:
            assert resp.status == 403
        async with s.get(f"{r.url}/metrics", headers={"Authorization": "Bearer s3cret"}) as resp:
            assert resp.status == 200
            assert "speclane_requests_total" in await resp.text()
