"""A web page on another site cannot make the user's browser run a request on speclane:
every door refuses a cross-site POST before anything runs, in its own error shape, while
programs (no Origin, or the router's own) keep working, ``curl -d`` form types included."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import aiohttp
import orjson
import pytest

from tests.conftest import router_settings, run_router
from tests.fakes.upstream import FakeUpstream
from tests.test_admin import CHROMIUM, CHROMIUM_ARGS, EVIL, LNA_FEATURES

CHAT = {"model": "fake-model", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}
DOORS = [
    ("/v1/chat/completions", CHAT),
    ("/v1/messages", CHAT),
    ("/api/chat", {"model": "fake-model", "messages": CHAT["messages"]}),
]
CROSS_SITE = [
    {"Origin": "http://evil.example"},
    {"Origin": "null"},
    {"Origin": "http://localhost:3000"},  # another local program's page
    {"Sec-Fetch-Site": "cross-site"},
    {"Sec-Fetch-Site": "same-site"},
]


async def post(url: str, body: dict[str, Any], **headers: str) -> tuple[int, Any]:
    headers.setdefault("Content-Type", "text/plain")  # what a page can send without preflight
    async with (
        aiohttp.ClientSession() as s,
        s.post(url, data=orjson.dumps(body), headers=headers) as resp,
    ):
        return resp.status, orjson.loads(await resp.read())


@pytest.mark.parametrize("headers", CROSS_SITE)
@pytest.mark.parametrize(("path", "body"), DOORS)
async def test_a_cross_site_post_runs_on_no_door(
    fake: FakeUpstream, path: str, body: dict[str, Any], headers: dict[str, str]
) -> None:
    async with run_router(router_settings(fake)) as r:
        status, answer = await post(f"{r.url}{path}", body, **headers)
    assert status == 403, answer
    assert "other sites' web pages are refused" in orjson.dumps(answer).decode(), answer
    if path == "/v1/chat/completions":
        assert answer["error"]["code"] == "cross_site_request"
    assert fake.requests == []


@pytest.mark.parametrize(
    "headers",
    [
        {},  # curl, an SDK, an agent: no Origin
        {"Content-Type": "application/x-www-form-urlencoded"},  # curl -d without -H
        {"Sec-Fetch-Site": "same-origin"},
        {"Sec-Fetch-Site": "none"},
    ],
)
async def test_programs_and_same_origin_pages_are_served(
    fake: FakeUpstream, headers: dict[str, str]
) -> None:
    async with run_router(router_settings(fake)) as r:
        status, answer = await post(f"{r.url}/v1/chat/completions", CHAT, **headers)
        own = f"http://127.0.0.1:{r.port}"
        same, _ = await post(f"{r.url}/v1/chat/completions", CHAT, Origin=own, **headers)
    assert status == 200, answer
    assert same == 200
    assert len(fake.requests) == 2


ATTACK_PAGE = """<!doctype html><title>win a prize</title><script>
fetch("{api}", {{method: "POST", mode: "no-cors", body: '{chat}',
                headers: {{"Content-Type": "text/plain"}}}})
  .catch(() => null).finally(() => {{ window.done = true; }});
</script>"""


@pytest.mark.skipif(
    not Path(CHROMIUM).exists(), reason="needs Debian's chromium at /usr/bin/chromium"
)
async def test_in_headless_chromium_another_sites_page_cannot_run_a_chat(
    fake: FakeUpstream,
) -> None:
    """The router needs no key (the local default): a page on another site posts a chat
    request as text/plain JSON with a no-cors fetch, which a browser sends without asking."""
    playwright_api = pytest.importorskip("playwright.async_api")
    from aiohttp import web

    from tests.conftest import serve_app

    async with run_router(router_settings(fake)) as r:
        page_body = ATTACK_PAGE.format(
            api=f"http://127.0.0.1:{r.port}/v1/chat/completions", chat=orjson.dumps(CHAT).decode()
        )

        async def prize(_: web.Request) -> web.Response:
            return web.Response(text=page_body, content_type="text/html")

        attacker = web.Application()
        attacker.router.add_get("/", prize)
        async with serve_app(attacker) as evil_port, playwright_api.async_playwright() as pw:
            browser = await pw.chromium.launch(
                executable_path=CHROMIUM,
                args=[
                    *CHROMIUM_ARGS,
                    f"--host-resolver-rules=MAP {EVIL} 127.0.0.1",
                    f"--disable-features={LNA_FEATURES}",
                ],
            )
            try:
                page = await browser.new_page()
                await page.goto(f"http://{EVIL}:{evil_port}/")
                await page.wait_for_function("window.done", timeout=15_000)
            finally:
                await browser.close()
    assert fake.requests == []
