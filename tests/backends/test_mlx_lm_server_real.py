"""A real ``mlx_lm.server`` (installed with mlx-lm) behind speclane, plain and with a draft.

Started on the prepared default model, with an empty Hugging Face cache directory, as on a
fresh machine: its ``/v1/models`` then answers 200 with an empty body, and speclane must
still find it ready (through ``/health``). The official OpenAI client sends one
non-streaming and one streaming request (few tokens) each time; the answer, the usage,
readiness and the speculation labels are checked: a draft on ``mlx_lm`` cannot be observed
(the server never reports draft statistics), which is said as such.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import subprocess
import sys
import tempfile
from collections.abc import AsyncIterator
from pathlib import Path

import aiohttp
import pytest

from router.bench.common import procs
from router.lanes.blas import preload_env
from router.lanes.modelprep import ensure_default_models
from tests.conftest import metric_value, router_settings, run_router

pytestmark = pytest.mark.realmodel

START_TIMEOUT = 180.0  # loading competes for 2 shared cores
MODEL = "default_model"  # mlx_lm.server's name for the model given on its command line


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextlib.asynccontextmanager
async def mlx_lm_server(model: Path, draft: Path | None, hf_home: Path) -> AsyncIterator[str]:
    port = free_port()
    cmd = [
        sys.executable,
        "-m",
        "mlx_lm.server",
        "--model",
        str(model),
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
    ]
    if draft is not None:
        cmd += ["--draft-model", str(draft), "--num-draft-tokens", "3"]
    env = preload_env()
    env.update(HF_HOME=str(hf_home), HF_HUB_OFFLINE="1")
    log = tempfile.TemporaryFile(mode="w+")
    proc = await asyncio.create_subprocess_exec(*cmd, env=env, stdout=log, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    try:
        try:
            await procs.wait_http(f"{url}/health", proc, START_TIMEOUT)
        except RuntimeError as e:
            raise AssertionError(f"mlx_lm.server did not start: {e}\n{_tail(log)}") from e
        yield url
    finally:
        await procs.stop(proc, 20)
        log.close()


def _tail(log: object) -> str:
    log.seek(0)  # type: ignore[attr-defined]
    return "".join(log.readlines()[-20:])  # type: ignore[attr-defined]


async def test_mlx_lm_server_plain_then_with_draft(tmp_path: Path) -> None:
    target, draft_dir = ensure_default_models(quiet=True)
    for n, draft in enumerate((None, draft_dir)):
        async with mlx_lm_server(target, draft, tmp_path / "hf") as url:
            async with aiohttp.ClientSession() as s, s.get(f"{url}/v1/models") as resp:
                # the fresh-machine answer speclane used to choke on
                assert resp.status == 200
                listed = await resp.read()
            settings = router_settings(
                backends=[
                    {
                        "name": "mlx",
                        "kind": "mlx_lm",
                        "base_url": f"{url}/v1",
                        "models": [MODEL],
                        "speculative": draft is not None,
                        "read_timeout": 120,
                    }
                ]
            )
            async with run_router(settings) as r:
                async with aiohttp.ClientSession() as s:
                    async with s.get(f"{r.url}/readyz") as resp:
                        assert resp.status == 200
                        assert (await resp.json())["backends"]["mlx"]["ready"] is True
                    async with s.get(f"{r.url}/admin/lanes") as resp:
                        lanes = (await resp.json())["backends"]
                    async with s.get(f"{r.url}/admin/spec") as resp:
                        spec = await resp.json()
                client = r.client(timeout=180)
                # different prompts: in draft mode mlx_lm.server answers a prompt already in
                # its prompt cache with 1 token of null content (its bug, see the fixtures)
                answer = await client.chat.completions.create(
                    model=MODEL,
                    max_tokens=6,
                    temperature=0,
                    messages=[{"role": "user", "content": f"Say hello ({n})."}],
                )
                text = answer.choices[0].message.content
                assert text and answer.usage is not None
                assert 0 < answer.usage.completion_tokens <= 6 and answer.usage.prompt_tokens > 0
                stream = await client.chat.completions.create(
                    model=MODEL,
                    max_tokens=6,
                    temperature=0,
                    stream=True,
                    stream_options={"include_usage": True},
                    messages=[{"role": "user", "content": f"Name a colour ({n})."}],
                )
                parts, usage = [], None
                async for chunk in stream:
                    if chunk.choices and chunk.choices[0].delta.content:
                        parts.append(chunk.choices[0].delta.content)
                    usage = chunk.usage or usage
                assert "".join(parts) and usage is not None
                assert 0 < usage.completion_tokens <= 6
                async with aiohttp.ClientSession() as s, s.get(f"{r.url}/metrics") as resp:
                    metrics = await resp.text()
        assert metric_value(metrics, "speclane_requests_total", backend="mlx", status="200") == 2
        assert metric_value(metrics, "speclane_requests_total", status="499") is None
        status = next(b for b in lanes if b["name"] == "mlx")["speculation"]
        row = next(b for b in spec["backends"] if b["backend"] == "mlx")
        assert {k: row[k] for k in status} == status
        assert spec["workloads"] == []  # nothing auto-disable could judge
        if draft is None:
            assert status["observation"] == "not_requested" and status["requested"] is False
            assert metric_value(metrics, "speclane_spec_observed", backend="mlx") is None
        else:
            assert status["observation"] == "unobservable" and status["observed"] is None
            assert status["reason"].startswith("cannot be observed on this backend")
            assert metric_value(metrics, "speclane_spec_observed", backend="mlx") == -1
        print(
            f"mlx_lm.server draft={draft is not None}: /v1/models {listed[:80]!r}; "
            f"{text!r}; stream {''.join(parts)!r}"
        )
