"""Only the router reaches a real MLX lane worker (issue #36, class 2; slow: one real worker,
the default model without a draft, a few tokens). The rules with fake workers:
tests/lanes/test_worker_secret.py."""

from __future__ import annotations

from pathlib import Path

import aiohttp
import pytest

from router.kernel.worker_contract import WORKER_SECRET_HEADER
from router.lanes.modelprep import DEFAULT_MODEL_NAME, ensure_default_models
from tests.conftest import router_settings, run_router

pytestmark = pytest.mark.realmodel


async def test_a_real_lane_worker_refuses_a_stranger_and_serves_the_router(
    tmp_path: Path,
) -> None:
    model, _ = ensure_default_models(quiet=True)
    empty = tmp_path / "models"
    empty.mkdir()
    settings = router_settings(
        backends=[],
        lanes={
            "model": str(model),
            "model_name": DEFAULT_MODEL_NAME,
            "models_dir": str(empty),
            "layout": "shared",  # one worker process
            "prompt_cache_bytes": 0,
            "startup_timeout": 300,
        },
    )
    async with run_router(settings) as router:
        backends = [b for b in router.services.pool if b.lane is not None]
        assert backends and all(b.worker_secret for b in backends)
        url = backends[0].base_url
        body = {
            "model": DEFAULT_MODEL_NAME,
            "messages": [{"role": "user", "content": "Say hi."}],
            "max_tokens": 3,
        }
        async with aiohttp.ClientSession() as s:
            async with s.post(f"{url}/chat/completions", json=body) as r:
                assert r.status == 401
                assert (await r.json())["error"]["code"] == "worker_secret_required"
            async with s.get(url.removesuffix("/v1") + "/health") as r:
                assert r.status == 401
            wrong = {WORKER_SECRET_HEADER: "guess"}
            async with s.post(f"{url}/chat/completions", json=body, headers=wrong) as r:
                assert r.status == 401
        answer = await router.client(timeout=300).chat.completions.create(**body)
        assert answer.choices[0].message.content
        assert answer.usage is not None and answer.usage.completion_tokens <= 3
