"""``speclane status`` against a fake /admin/lanes on loopback, and against a real router."""

from __future__ import annotations

import asyncio
import json
import socket
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import pytest
from aiohttp import web

from router.cli.status import COLUMNS, main
from tests.conftest import (
    add_fake_lane,
    fake_upstreams,
    router_settings,
    run_router,
    serve_app,
)

KEY = "s3cret"

LANES = {
    "backends": [
        {
            "name": "speculative",
            "kind": "speclane",
            "lane": "speculative",
            "url": "http://127.0.0.1:40001/v1",
            "model": "SmolLM2-135M-Instruct",
            "models": ["SmolLM2-135M-Instruct"],
            "draft": "/root/.local/share/speclane/models/SmolLM2-135M-Instruct-draft",
            "state": "ready",
            "inflight": 1,
            "speculation": {
                "mode": "graceful",
                "requested": True,
                "active": False,
                "observed": None,
                "reason": "vocab_size_mismatch: the draft's tokenizer has 8 tokens",
            },
        },
        {
            "name": "batching",
            "kind": "speclane",
            "lane": "batching",
            "url": "http://127.0.0.1:40002/v1",
            "model": "SmolLM2-135M-Instruct",
            "models": ["SmolLM2-135M-Instruct"],
            "draft": None,
            "state": "failed",
            "inflight": 0,
            "last_error": "worker exited with code 1",
            "speculation": {
                "mode": None,
                "requested": False,
                "active": False,
                "observed": None,
                "reason": None,
            },
        },
        {
            "name": "lmstudio",
            "kind": "lmstudio",
            "lane": None,
            "url": "http://127.0.0.1:1234/v1",
            "model": None,
            "models": ["qwen2.5-7b", "llama-3"],
            "draft": None,
            "state": "ready",
            "inflight": 0,
            "speculation": {
                "mode": None,
                "requested": True,
                "active": None,
                "observed": True,
                "reason": None,
            },
        },
    ]
}


@asynccontextmanager
async def fake_admin(
    body: Any = LANES, key: str | None = KEY, status: int = 200
) -> AsyncIterator[str]:
    """/admin/lanes as the router serves it: bearer key checked like router.admin does."""

    async def lanes(request: web.Request) -> web.Response:
        auth = request.headers.get("Authorization")
        if key is not None and auth is None:
            return web.json_response(
                {"error": {"message": "admin endpoints require a key"}}, status=401
            )
        if key is not None and auth != f"Bearer {key}":
            return web.json_response({"error": {"message": "wrong admin key"}}, status=403)
        if status != 200:
            return web.json_response({"error": {"message": "boom"}}, status=status)
        return web.json_response(body)

    app = web.Application()
    app.router.add_get("/admin/lanes", lanes)
    async with serve_app(app) as port:
        yield f"http://127.0.0.1:{port}"


async def run(*argv: str) -> int:
    # The CLI blocks on urllib: run it off the loop that serves the fake.
    return await asyncio.to_thread(main, list(argv))


@pytest.fixture(autouse=True)
def no_env_key(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("SPECLANE_ADMIN_KEY", raising=False)


async def test_table(capsys: pytest.CaptureFixture[str]) -> None:
    async with fake_admin() as url:
        assert await run("--url", url, "--admin-key", KEY) == 0
    out = capsys.readouterr().out
    lines = out.splitlines()
    assert lines[0].split() == list(COLUMNS)
    spec = lines[1].split()
    assert spec[:12] == [
        "speculative",
        "speclane",
        "speculative",
        "ready",
        "1",
        "SmolLM2-135M-Instruct",
        "SmolLM2-135M-Instruct-draft",
        "graceful",
        "yes",
        "no",
        "-",
        "vocab_size_mismatch:",
    ]
    assert lines[1].endswith("the draft's tokenizer has 8 tokens")
    assert lines[2].split()[:4] == ["batching", "speclane", "batching", "failed"]
    assert lines[3].split()[5:11] == ["qwen2.5-7b", "(+1)", "-", "-", "yes", "-"]
    assert "last errors:" in out and "batching: worker exited with code 1" in out
    # the columns line up: every row starts its MODEL column at the same offset
    offset = lines[0].index("MODEL")
    assert lines[1][offset:].startswith("SmolLM2") and lines[3][offset:].startswith("qwen2.5")


MODELS = [
    {
        "name": "SmolLM2-135M-Instruct",
        "aliases": ["smol", "default"],
        "state": "loaded",
        "size_bytes": 270 << 20,
        "estimate_bytes": 600 << 20,
        "pinned": False,
        "ttl": 300,
        "idle_seconds": 12.4,
        "in_flight": 1,
        "layout": "shared",
        "lanes": ["speculative", "batching"],
        "last_error": None,
    },
    {
        "name": "qwen2.5-coder-7b",
        "aliases": [],
        "state": "unloaded",
        "size_bytes": 4608 << 20,
        "estimate_bytes": 5 << 30,
        "pinned": True,
        "ttl": 0,
        "idle_seconds": None,
        "in_flight": 0,
        "layout": None,
        "lanes": [],
        "last_error": None,
    },
    {
        "name": "broken",
        "aliases": [],
        "state": "failed",
        "size_bytes": None,
        "estimate_bytes": None,
        "pinned": False,
        "ttl": 600,
        "idle_seconds": None,
        "in_flight": 0,
        "layout": None,
        "lanes": [],
        "last_error": "config.json: unknown model_type 'mamba9'",
    },
]


async def test_one_line_per_model_when_the_router_serves_models_on_demand(
    capsys: pytest.CaptureFixture[str],
) -> None:
    async with fake_admin({**LANES, "models": MODELS}) as url:
        assert await run("--url", url, "--admin-key", KEY) == 0
    out = capsys.readouterr().out
    lines = out.split("\nmodels:\n", 1)[1].splitlines()
    assert lines == [
        "  SmolLM2-135M-Instruct  loaded, size 270 MiB, estimate 600 MiB, shared lanes "
        "speculative+batching, in flight 1, idle 12 s, ttl 5.0 min, aliases smol, default",
        "  qwen2.5-coder-7b       unloaded, size 4.50 GiB, estimate 5.00 GiB, pinned",
        "  broken                 failed, size -, estimate -, ttl 10.0 min, last error: "
        "config.json: unknown model_type 'mamba9'",
    ]
    async with fake_admin({**LANES, "models": []}) as url:
        assert await run("--url", url, "--admin-key", KEY) == 0
    assert capsys.readouterr().out.endswith("\nmodels: none servable\n")


async def test_no_models_section_from_a_router_without_models_on_demand(
    capsys: pytest.CaptureFixture[str],
) -> None:
    async with fake_admin() as url:
        assert await run("--url", url, "--admin-key", KEY) == 0
    assert "models" not in capsys.readouterr().out


async def test_json_and_env_key(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("SPECLANE_ADMIN_KEY", KEY)
    async with fake_admin() as url:
        assert await run("--url", url + "/", "--json") == 0
    assert json.loads(capsys.readouterr().out) == LANES


@pytest.mark.parametrize(
    ("key", "expected"),
    [
        (
            None,
            "requires an admin key (admin endpoints require a key): pass --admin-key or set "
            "SPECLANE_ADMIN_KEY",
        ),
        ("wrong", "refused the admin key (wrong admin key)"),
    ],
)
async def test_auth_failures(
    capsys: pytest.CaptureFixture[str], key: str | None, expected: str
) -> None:
    async with fake_admin() as url:
        argv = ["--url", url] + (["--admin-key", key] if key else [])
        assert await run(*argv) == 1
    captured = capsys.readouterr()
    assert captured.out == ""
    err = captured.err.strip()
    assert err.startswith("speclane status: ") and expected in err and "\n" not in err


async def test_server_error_and_wrong_body(capsys: pytest.CaptureFixture[str]) -> None:
    async with fake_admin(key=None, status=500) as url:
        assert await run("--url", url) == 1
    assert "HTTP 500: boom" in capsys.readouterr().err
    async with fake_admin(body={"hello": 1}, key=None) as url:
        assert await run("--url", url) == 1
    assert "without a 'backends' list" in capsys.readouterr().err


async def test_unreachable_router(capsys: pytest.CaptureFixture[str]) -> None:
    with socket.socket() as s:  # a port nobody listens on once this socket is closed
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    assert await run("--url", f"http://127.0.0.1:{port}") == 1
    err = capsys.readouterr().err.strip()
    assert err.startswith(f"speclane status: cannot reach the router at http://127.0.0.1:{port}")
    assert "\n" not in err


async def test_against_a_real_router(capsys: pytest.CaptureFixture[str]) -> None:
    async with fake_upstreams("ext", "spec") as (ext, spec_lane):
        settings = router_settings(ext, admin_key=KEY)
        async with run_router(
            settings, setup=lambda wired: add_fake_lane(wired, "speculative", spec_lane)
        ) as r:
            assert await run("--url", r.url, "--admin-key", KEY) == 0
            table = capsys.readouterr().out
            assert await run("--url", r.base_url, "--admin-key", KEY, "--json") == 0
            served = json.loads(capsys.readouterr().out)
    names = {b["name"]: b for b in served["backends"]}
    assert names["speculative"]["speculation"]["requested"] is True
    rows = {line.split()[0]: line.split() for line in table.splitlines()[1:] if line.strip()}
    assert set(rows) == set(names)
    assert rows["speculative"][2] == "speculative" and rows["ext"][1] == "openai"


def test_the_layout_and_each_worker_process_follow_the_table() -> None:
    import io

    from router.cli.status import print_layout

    out = io.StringIO()
    layout = {
        "layout": "shared",
        "requested": "auto",
        "reason": "two copies would take 9 GiB",
        "estimate_bytes": 3 << 30,
        "limit_bytes": 6 << 30,
        "separate_bytes": 9 << 30,
        "shared_bytes": 3 << 30,
        "total_bytes": 8 << 30,
    }
    workers = [
        {
            "lanes": ["speculative", "batching"],
            "state": "ready",
            "pid": 42,
            "rss_bytes": 3 << 29,
            "pss_bytes": 1 << 30,
        }
    ]
    print_layout(layout, workers, out)
    text = out.getvalue()
    assert (
        "lanes layout: shared (requested auto: two copies would take 9 GiB); estimate "
        "3.00 GiB of 6.00 GiB allowed" in text
    )
    assert "worker speculative+batching: ready, pid 42, rss 1.50 GiB, pss 1.00 GiB" in text
    out = io.StringIO()
    print_layout(None, [], out)  # a router without lanes, or an older one
    assert out.getvalue() == ""


def test_a_group_worker_shows_its_ranks_and_memory_per_host() -> None:
    import io

    from router.cli.status import print_layout

    out = io.StringIO()
    group = {"ranks": 3, "backend": "ring", "parallel": "tensor"}
    workers = [
        {"lanes": ["speculative"], "state": "ready", "pid": 7, "rss_bytes": 1 << 30,
         "pss_bytes": 1 << 30,
         "group": {**group, "host_memory_bytes": {"10.0.0.1": 1 << 30, "10.0.0.2": 1 << 31}}},
        {"lanes": ["speculative"], "state": "starting", "group": group},
    ]  # fmt: skip
    print_layout(None, workers, out)
    text = out.getvalue()
    assert (
        "group: 3 ranks (ring, tensor); memory per host: 10.0.0.1 1.00 GiB, 10.0.0.2 2.00 GiB"
        in text
    )
    assert "memory per host: not reported yet" in text
