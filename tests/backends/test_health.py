"""Health checks of external backends, as start-up and routing see them."""

from __future__ import annotations

import asyncio

import aiohttp
import orjson
import pytest

import router.app
from router.backends.health import check_once, model_ids
from router.config.settings import Settings
from tests.conftest import fake_upstreams, router_settings, run_router, wait_until
from tests.fakes.replay import Capture, ReplayUpstream, load

CHAT = [{"role": "user", "content": "hi"}]


async def test_a_backend_that_never_answers_its_health_check_does_not_hold_up_start(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setattr(router.app, "STARTUP_HEALTH_WAIT", 0.3)
    async with fake_upstreams("hung", "up") as (hung, up):
        hung.models_gate = asyncio.Event()
        hung.models = ("hung-model",)
        # Its probe would give up only after connect_timeout + 5 s = 7 s.
        async with run_router(router_settings(hung, up)) as r:
            assert hung.models_asked.is_set() and not hung.models_gate.is_set()
            pool = r.services.pool
            assert pool["up"].ready and not pool["hung"].ready
            assert "first health check of hung" in caplog.text
            answer = await r.client().chat.completions.create(model="fake-model", messages=CHAT)
            assert answer.choices[0].message.content
            async with aiohttp.ClientSession() as s, s.get(f"{r.url}/v1/models") as resp:
                assert [m["id"] for m in (await resp.json())["data"]] == ["fake-model"]
            # Its answer, when it comes, makes it ready without another round.
            hung.models_gate.set()
            await wait_until(lambda: pool["hung"].ready)
            again = await r.client().chat.completions.create(model="hung-model", messages=CHAT)
            assert again.choices[0].message.content


async def test_start_waits_for_backends_that_answer(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(router.app, "STARTUP_HEALTH_WAIT", 30.0)
    async with fake_upstreams("a", "b") as (a, b):
        async with run_router(router_settings(a, b)) as r:
            # Ready from the first request: start waited for the first round.
            assert r.services.pool["a"].ready and r.services.pool["b"].ready


# --- readiness on real servers' answers (tests/fixtures/real-backends) --------------------

MLX_HEALTH_OK = Capture(200, "application/json", b'{"status": "ok"}')  # mlx_lm.server 0.32
MLX_HEALTH_LOADING = Capture(503, "application/json", b'{"status": "unavailable"}')
NO_HF_CACHE = "mlxlm-0.32.2_v1-models_no-hf-cache.http"  # 200, empty body


def mlx_settings(up: ReplayUpstream, **backend: object) -> Settings:
    return router_settings(
        backends=[{"name": "mlx", "kind": "mlx_lm", "base_url": up.base_url, **backend}]
    )


async def test_mlx_lm_with_configured_models_is_ready_despite_an_empty_model_list() -> None:
    gets = {"/v1/models": load(NO_HF_CACHE), "/health": MLX_HEALTH_OK}
    async with ReplayUpstream(load("mlxlm-0.32.2_plain_chat_nonstream.http"), gets=gets) as up:
        assert load(NO_HF_CACHE).status == 200 and load(NO_HF_CACHE).body == b""
        async with run_router(mlx_settings(up, models=["smollm2"])) as r:
            pool = r.services.pool
            assert pool["mlx"].ready and pool["mlx"].last_error is None
            answer = await r.client().chat.completions.create(model="smollm2", messages=CHAT)
            assert answer.choices[0].message.content
            assert answer.usage is not None and answer.usage.completion_tokens > 0


async def test_mlx_lm_readiness_is_its_health_endpoint() -> None:
    gets = {"/v1/models": load("mlxlm-0.32.2_v1-models.http"), "/health": MLX_HEALTH_LOADING}
    async with ReplayUpstream(load("mlxlm-0.32.2_plain_chat_nonstream.http"), gets=gets) as up:
        async with run_router(mlx_settings(up, models=["smollm2"])) as r:
            backend = r.services.pool["mlx"]
            assert not backend.ready and backend.last_error == "GET /health answered 503"
            up.gets["/health"] = MLX_HEALTH_OK
            await check_once(r.services.started.client_session(), backend, r.services.metrics)
            assert backend.ready


async def test_mlx_lm_without_configured_models_discovers_them_when_listed() -> None:
    listed = load("mlxlm-0.32.2_v1-models.http")
    gets = {"/v1/models": listed, "/health": MLX_HEALTH_OK}
    async with ReplayUpstream(load("mlxlm-0.32.2_plain_chat_nonstream.http"), gets=gets) as up:
        async with run_router(mlx_settings(up)) as r:
            backend = r.services.pool["mlx"]
            assert backend.ready
            assert backend.models == {orjson.loads(listed.body)["data"][0]["id"]}
            up.gets["/v1/models"] = load(NO_HF_CACHE)  # the list empties: still up
            await check_once(r.services.started.client_session(), backend, r.services.metrics)
            assert backend.ready and backend.models == frozenset()


async def test_an_empty_model_list_does_not_break_readiness_of_other_kinds() -> None:
    async with ReplayUpstream(
        load("llamacpp-server_plain_chat_nonstream.http"), gets={"/v1/models": load(NO_HF_CACHE)}
    ) as up:
        settings = router_settings(
            backends=[
                {"name": "l", "kind": "llamacpp", "base_url": up.base_url, "models": ["smollm2"]}
            ]
        )
        async with run_router(settings) as r:
            assert r.services.pool["l"].ready


@pytest.mark.parametrize(
    ("name", "ids"),
    [
        ("mlxlm-0.32.2_v1-models_no-hf-cache.http", set()),
        (
            "mlxlm-0.32.2_v1-models.http",
            {"/Users/me/mmmmmmmmmmmmmmmmmmmodels/SmolLM2-135M-Instruct"},
        ),
        ("llamacpp-server_v1-models.json", None),
        ("llama-cpp-python-0.3.36_v1-models.json", None),
        ("vllm-mlx-0.6.0_v1-models.json", None),
    ],
)
def test_model_ids_of_every_captured_model_list(name: str, ids: set[str] | None) -> None:
    body = load(name).body
    if ids is None:  # the ids the capture lists, read without the function under test
        ids = {m["id"] for m in orjson.loads(body)["data"]}
        assert ids
    assert model_ids(body) == ids
