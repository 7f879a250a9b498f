"""Models on demand with real MLX workers (slow, serial): the embedded default model under
two names (symbolic links to its prepared folder), one loaded at start-up, the other on its
first request. The rules themselves (eviction order, policies, aliases, keep_alive) are
tested with fake workers in tests/lanes/test_models.py."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import openai
import pytest

from router.lanes.modelprep import ensure_default_models
from tests.conftest import RunningRouter, router_settings, run_router, wait_until
from tests.lanes.test_models import entry, gone, metric, worker_pids

pytestmark = pytest.mark.realmodel

PROMPT = [{"role": "user", "content": "What is the capital of France?"}]


def models_folder(tmp: Path) -> Path:
    model, _ = ensure_default_models(quiet=True)
    folder = tmp / "models"
    folder.mkdir()
    for name in ("alpha", "beta"):
        (folder / name).symlink_to(model)
    broken = folder / "broken"  # looks like a model, cannot load
    broken.mkdir()
    (broken / "config.json").write_text('{"model_type": "llama"}')
    (broken / "model.safetensors").write_bytes(b"not safetensors")
    return folder


def settings(folder: Path, **lanes: Any) -> Any:
    return router_settings(
        backends=[],
        lanes={
            "model": str(folder / "alpha"),
            "models_dir": str(folder),
            "layout": "shared",  # one worker process per model
            "prompt_cache_bytes": 0,
            "machine_memory_bytes": 64 << 30,
            "startup_timeout": 300,
            "load_timeout": 300,
            **lanes,
        },
    )


async def ask(router: RunningRouter, model: str, max_tokens: int = 8) -> str:
    answer = await router.client(timeout=300).chat.completions.create(
        model=model, messages=PROMPT, max_tokens=max_tokens, temperature=0
    )
    return answer.choices[0].message.content or ""


async def test_load_on_first_request_shared_by_concurrent_requests_then_ttl_unload(
    tmp_path: Path,
) -> None:
    folder = models_folder(tmp_path)
    async with run_router(settings(folder, ttl=1.0)) as router:
        assert entry(router, "beta")["state"] == "unloaded"
        answers = await asyncio.gather(ask(router, "beta"), ask(router, "beta"))
        assert all(answers), answers
        assert metric(router, "speclane_model_loads_total", model="beta", outcome="loaded") == 1
        (pid,) = worker_pids(router, "beta")
        # a broken folder: a clear 503 naming the model; the others keep serving
        with pytest.raises(openai.APIStatusError) as caught:
            await ask(router, "broken")
        body: Any = caught.value.body
        assert (caught.value.status_code, body["code"]) == (503, "model_load_failed")
        assert "'broken'" in body["message"]
        assert await ask(router, "alpha")
        # idle for its TTL: beta is unloaded and its worker exits; alpha (start-up) stays
        await wait_until(lambda: entry(router, "beta")["state"] == "unloaded", 30)
        await wait_until(lambda: gone(pid), 30)
        assert entry(router, "alpha")["state"] == "loaded"


async def test_a_stream_in_flight_keeps_its_model_while_another_waits_for_memory(
    tmp_path: Path,
) -> None:
    folder = models_folder(tmp_path)
    lanes = settings(folder).lanes
    one = lanes.prompt_cache_bytes + 400 * (1 << 20)  # PROCESS_BYTES
    limit_bytes = one + (folder / "alpha" / "model.safetensors").stat().st_size + 1024
    extra = {"models": [{"name": "alpha", "path": str(folder / "alpha"), "pinned": False}]}
    async with run_router(settings(folder, memory_limit_bytes=limit_bytes, **extra)) as router:
        client = router.client(timeout=300)
        stream = await client.chat.completions.create(
            model="alpha", messages=PROMPT, max_tokens=200, stream=True, temperature=0
        )
        chunks = aiter(stream)
        first = await anext(chunks)  # alpha's stream is open
        waiting = asyncio.create_task(ask(router, "beta"))
        await wait_until(lambda: entry(router, "beta")["state"] == "loading", 30)
        alpha = entry(router, "alpha")
        assert alpha["in_flight"] == 0 or alpha["state"] == "loaded"  # never under a stream
        text, finished = [first], None
        async for chunk in chunks:
            text.append(chunk)
            if chunk.choices and chunk.choices[0].finish_reason:
                finished = chunk.choices[0].finish_reason
        assert finished in ("stop", "length")  # alpha's stream completed
        assert await waiting  # then beta got the memory: alpha, idle, was unloaded
        assert entry(router, "alpha")["state"] == "unloaded"
        assert metric(router, "speclane_model_unloads_total", model="alpha", reason="memory") == 1
