"""The status page: ``/`` for browsers and Ollama clients, ``/admin/status``'s live data,
the history arithmetic, and the page itself in headless Chromium (Debian's, via Playwright)
against a router whose lanes are fake upstreams."""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from router.admin import lanes_view
from router.history import Sample, points
from router.metrics import Metrics
from tests.conftest import RunningRouter, lanes_router, router_settings, run_router
from tests.fakes.upstream import Behaviour, FakeUpstream

REPO = Path(__file__).resolve().parents[2]
CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
CHAT = [{"role": "user", "content": "hi"}]
NONE = "\u2013"  # the page's cell for a value it does not have (an en dash)


async def get(url: str, method: str = "GET", **headers: str) -> tuple[int, str, str]:
    async with aiohttp.ClientSession() as s, s.request(method, url, headers=headers) as resp:
        return resp.status, resp.headers.get("Content-Type", ""), await resp.text()


async def test_root_is_the_page_for_browsers_and_ollama_is_running_for_the_rest(
    fake: FakeUpstream,
) -> None:
    async with run_router(router_settings(fake)) as r:
        status, ctype, body = await get(f"{r.url}/", Accept="text/html,application/xhtml+xml")
        assert status == 200 and ctype.startswith("text/html") and "<title>speclane" in body
        status, ctype, body = await get(f"{r.url}/")  # aiohttp sends Accept: */*
        assert (status, body) == (200, "Ollama is running")
        assert ctype.startswith("text/plain")
        status, _, body = await get(f"{r.url}/", "HEAD")
        assert status == 200 and body == ""
        status, ctype, _ = await get(f"{r.url}/ui")
        assert status == 200 and ctype.startswith("text/html")


async def test_admin_status_follows_the_admin_rules(fake: FakeUpstream) -> None:
    async with run_router(router_settings(fake, admin_key="s3cret")) as r:
        status, _, _ = await get(f"{r.url}/admin/status")
        assert status == 401
        status, _, _ = await get(f"{r.url}/admin/status", Authorization="Bearer wrong")
        assert status == 403
        status, _, body = await get(f"{r.url}/admin/status", Authorization="Bearer s3cret")
        assert status == 200 and '"backends"' in body
        status, _, _ = await get(f"{r.url}/ui")  # the page holds no data: served to all
        assert status == 200


async def test_admin_status_has_what_the_page_shows(fake: FakeUpstream) -> None:
    async with run_router(router_settings(fake)) as r:
        r.services.history.sample()
        await r.client().chat.completions.create(model="fake-model", messages=CHAT)
        r.services.history.sample()
        async with aiohttp.ClientSession() as s, s.get(f"{r.url}/admin/status") as resp:
            data = await resp.json()
    assert [b["name"] for b in data["backends"]] == ["fake"]
    assert data["backends"][0]["state"] == "ready"
    assert {"workloads", "backends", "settings"} <= set(data["spec"])
    [recent] = data["recent"]
    assert recent["client"] == "default" and recent["status"] == 200
    assert recent["decision"] and recent["backend"] == "fake"
    point = data["history"]["points"][-1]  # (the app also samples at start-up)
    assert point["requests_per_s"] > 0
    assert {q["client"] for q in data["queues"]} == {"default"}


async def test_admin_status_includes_what_admin_lanes_answers(fake: FakeUpstream) -> None:
    # The page shows what /admin/lanes has (the models served on demand among it) without a
    # second list of fields to keep in step.
    async with run_router(router_settings(fake)) as r:
        async with aiohttp.ClientSession() as s:
            async with s.get(f"{r.url}/admin/lanes") as resp:
                lanes = await resp.json()
            async with s.get(f"{r.url}/admin/status") as resp:
                status = await resp.json()
    assert {"backends", "layout", "workers"} <= set(lanes)
    assert {k: status[k] for k in lanes} == lanes


def test_history_points_are_differences_of_neighbouring_samples() -> None:
    samples = [
        Sample(
            at=100.0,
            requests=10,
            drafted=30,
            accepted=12,
            decode={"true": (100.0, 10.0), "false": (40.0, 4.0)},
        ),
        Sample(
            at=105.0,
            requests=20,
            drafted=42,
            accepted=17,
            decode={"true": (175.0, 13.0), "false": (40.0, 4.0)},
        ),
        Sample(
            at=110.0,
            requests=20,
            drafted=42,
            accepted=17,
            decode={"true": (175.0, 13.0), "false": (40.0, 4.0)},
        ),
    ]
    first, idle = points(samples)
    assert first == {
        "at": 105.0,
        "requests_per_s": 2.0,
        "drafted": 12,
        "acceptance": pytest.approx(5 / 12, abs=1e-4),
        "decode_tps_spec": 25.0,
        "decode_tps_plain": None,
    }
    assert idle["acceptance"] is None and idle["requests_per_s"] == 0.0
    assert idle["decode_tps_spec"] is None


def test_history_reads_the_metrics() -> None:
    from router.history import take

    m = Metrics()
    m.spec_draft_tokens.labels("speculative", "m", "default:none", "draft_model").inc(12)
    m.spec_accepted_tokens.labels("speculative", "m", "default:none", "draft_model").inc(5)
    m.decode_tps.labels("speculative", "true").observe(20.0)
    m.requests.labels("chat", "speculative", "200", "openai", "m").inc()
    s = take(m, 1.0)
    assert (s.requests, s.drafted, s.accepted) == (1, 12, 5)
    assert s.decode["true"] == (20.0, 1.0)


# --- the page in a real browser ------------------------------------------------------------


def spec_lane() -> FakeUpstream:
    lane = FakeUpstream(name="spec")
    lane.behaviour = Behaviour(
        chunks=12,
        interval=0.01,
        usage_extra={
            "speclane_spec": {
                "drafted": 12,
                "accepted": 5,
                "rejected": 7,
                "steps": 4,
                "num_draft_tokens": 3,
            }
        },
    )
    return lane


async def traffic(r: RunningRouter, rounds: int) -> None:
    client = r.client()
    for _ in range(rounds):
        r.services.history.sample()
        for _ in range(2):
            stream = await client.chat.completions.create(
                model="fake-model",
                messages=CHAT,
                stream=True,
                stream_options={"include_usage": True},
                extra_headers={"X-Speclane-Client": "default"},
            )
            async for _ in stream:
                pass
        await client.chat.completions.create(
            model="fake-model", messages=CHAT, extra_headers={"X-Speclane-Lane": "batching"}
        )
    r.services.history.sample()


@pytest.mark.skipif(
    not Path(CHROMIUM).exists(),
    reason="needs Debian's chromium at /usr/bin/chromium (./docker-less-run.sh test installs it)",
)
async def test_the_page_in_headless_chromium(tmp_path: Path) -> None:
    playwright_api = pytest.importorskip("playwright.async_api")
    spec, batch, ext = (
        spec_lane(),
        FakeUpstream(name="batch"),
        FakeUpstream(name="ext", models=("ext-model",)),
    )
    for f in (spec, batch, ext):
        await f.start()
    try:
        # (the fake lanes have no supervisor: the page says not_ready for them, as
        # /admin/lanes does; the external backend is health-checked: ready)
        external = [{"name": "ext", "kind": "openai", "base_url": ext.base_url}]
        async with lanes_router(spec, batch, backends=external) as r:
            await traffic(r, 3)
            async with playwright_api.async_playwright() as pw:
                browser = await pw.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
                try:
                    page = await browser.new_page(viewport={"width": 1366, "height": 900})
                    errors: list[str] = []
                    page.on("pageerror", lambda e: errors.append(str(e)))
                    await page.goto(f"{r.url}/", wait_until="load")
                    await page.wait_for_selector("#live.ok", timeout=15_000)
                    seen = await read_page(page)
                    # live: a new request shows up at the next poll without a reload
                    await r.client().chat.completions.create(
                        model="fake-model",
                        messages=CHAT,
                        extra_headers={
                            "X-Speclane-Client": "newcomer-probe",
                            "X-Speclane-Lane": "batching",
                        },
                    )
                    # (a selector, not wait_for_function: the page's CSP forbids eval)
                    await page.wait_for_selector("#recent tbody tr:nth-child(10)", timeout=15_000)
                    shot = REPO / "examples" / "status-page-fake-lanes.png"
                    await page.screenshot(path=str(tmp_path / "status-page.png"), full_page=True)
                finally:
                    await browser.close()
    finally:
        for f in (spec, batch, ext):
            await f.stop()
    assert errors == []
    assert set(seen["backends"]) == {"speculative", "batching", "ext"}
    assert "ready" in seen["states"]
    # one row per lane's state: the batching lane's sources are judged apart
    rows = {row.split("fake-model")[0]: row for row in seen["workloads"]}
    assert set(rows) == {"speculative", "batching"}, seen["workloads"]
    assert "42 %" in rows["speculative"] or "42 %" in seen["acceptance_now"]
    assert seen["recent_rows"] == 9 and "default" in seen["recent_text"]
    assert seen["chart_points"] > 0 and seen["decode_points"] > 0
    assert seen["queues"] == ["default"]
    assert seen["models_hidden"] is True  # no models list: nothing new on the page
    assert (tmp_path / "status-page.png").stat().st_size > 10_000
    if os.environ.get("SPECLANE_UPDATE_SCREENSHOT"):  # refresh examples/status-page-fake-lanes.png
        shutil.copyfile(tmp_path / "status-page.png", shot)


async def read_page(page: Any) -> dict[str, Any]:
    return await page.evaluate("""() => {
      const rows = (id) => Array.from(document.querySelectorAll(`#${id} tbody tr`));
      return {
        backends: rows("backends").map((r) => r.dataset.backend),
        states: rows("backends").map((r) => r.cells[3].textContent),
        workloads: rows("workloads").filter((r) => r.dataset.workload)
                     .map((r) => r.textContent),
        acceptance_now: document.getElementById("now-acceptance").textContent,
        recent_rows: rows("recent").length,
        recent_text: document.querySelector("#recent tbody").textContent,
        chart_points: Number(document.getElementById("chart-acceptance").dataset.points),
        decode_points: Number(document.getElementById("chart-decode").dataset.points),
        queues: rows("queues").map((r) => r.dataset.client),
        models_hidden: document.getElementById("models-section").hidden,
        models: rows("models").map((r) => Array.from(r.cells).map((c) => c.textContent)),
      };
    }""")


MODELS = [
    {
        "name": "SmolLM2-135M-Instruct",
        "aliases": ["smol"],
        "state": "loaded",
        "size_bytes": 270 << 20,
        "estimate_bytes": 3 << 30,
        "pinned": False,
        "ttl": 300,
        "idle_seconds": 42,
        "in_flight": 2,
        "layout": "shared",
        "lanes": ["speculative", "batching"],
        "last_error": None,
    },
    {
        "name": "<b>coder</b>",  # names come from folders: shown as text, never as HTML
        "aliases": [],
        "state": "failed",
        "size_bytes": None,
        "estimate_bytes": None,
        "pinned": True,
        "ttl": 0,
        "idle_seconds": None,
        "in_flight": 0,
        "layout": None,
        "lanes": [],
        "last_error": "out of memory",
    },
]


@pytest.mark.skipif(
    not Path(CHROMIUM).exists(),
    reason="needs Debian's chromium at /usr/bin/chromium (./docker-less-run.sh test installs it)",
)
async def test_the_page_shows_the_models_table_when_the_router_lists_models(
    fake: FakeUpstream, monkeypatch: pytest.MonkeyPatch
) -> None:
    playwright_api = pytest.importorskip("playwright.async_api")
    from router.observability import status

    def with_models(services: Any) -> dict[str, Any]:  # /admin/lanes of a models_dir router
        return {**lanes_view(services), "models": MODELS}

    monkeypatch.setattr(status, "lanes_view", with_models)
    async with run_router(router_settings(fake)) as r:
        async with playwright_api.async_playwright() as pw:
            browser = await pw.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
            try:
                page = await browser.new_page()
                errors: list[str] = []
                page.on("pageerror", lambda e: errors.append(str(e)))
                await page.goto(f"{r.url}/", wait_until="load")
                await page.wait_for_selector("#live.ok", timeout=15_000)
                seen = await read_page(page)
            finally:
                await browser.close()
    assert errors == []
    assert seen["models_hidden"] is False
    loaded, failed = seen["models"]
    assert loaded == [
        "SmolLM2-135M-Instruct",
        "smol",
        "loaded",
        "270 MiB",
        "3.00 GiB",
        "no",
        "42 s",
        "5.0 min",
        "2",
        "shared",
        "speculative + batching",
        NONE,
    ]
    assert failed[:3] == ["<b>coder</b>", NONE, "failed"]
    assert failed[5:8] == ["yes", NONE, "never (pinned)"] and failed[-1] == "out of memory"
