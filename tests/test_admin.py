"""The admin surface trusts no browser: a foreign Host (DNS rebinding) is refused on every
endpoint, a cross-site admin POST (CSRF) is refused, and a policy change the watcher held
because it widens access is applied only with the admin key or the local admin token
(``speclane policy reload``), never by a bare loopback POST. Real routers on loopback; the
last test drives headless Chromium."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import aiohttp
import orjson
import pytest

from router.cli.policy import main as policy_main
from router.server import publish_local_token
from tests.conftest import RunningRouter, router_settings, run_router
from tests.fakes.upstream import FakeUpstream

KEY = "sk-house-0123456789"
ADMIN_KEY = "admin-0123456789abcdef"
CLOSED = f'require_api_key = true\n[match]\napi_keys = ["{KEY}"]\n'
OPEN = "require_api_key = false\n"
FOREIGN = "rebind.attacker.example"


@asynccontextmanager
async def router(
    fake: FakeUpstream, directory: Path, **overrides: Any
) -> AsyncIterator[RunningRouter]:
    (directory / "default.toml").write_text(CLOSED)
    settings = router_settings(
        fake,
        policies_dir=str(directory),
        policy_poll_interval=3600,
        policy_settle_seconds=0,
        **overrides,
    )
    async with run_router(settings) as r:
        yield r


async def call(
    r: RunningRouter, method: str, path: str, body: bytes | None = None, **headers: str
) -> tuple[int, Any]:
    async with (
        aiohttp.ClientSession() as s,
        s.request(method, f"{r.url}{path}", data=body, headers=headers) as resp,
    ):
        raw = await resp.read()
    try:
        return resp.status, orjson.loads(raw)
    except orjson.JSONDecodeError:
        return resp.status, raw.decode(errors="replace")


def held(r: RunningRouter) -> float:
    value = r.services.metrics.registry.get_sample_value(
        "speclane_policy_reloads_total", {"result": "held"}
    )
    return value or 0.0


# --- DNS rebinding: the Host rule -------------------------------------------------------------

MESSAGES = orjson.dumps(
    {"model": "fake-model", "max_tokens": 8, "messages": [{"role": "user", "content": "hi"}]}
)
ENDPOINTS = [
    ("GET", "/v1/models", None, "openai"),
    (
        "POST",
        "/v1/chat/completions",
        orjson.dumps({"model": "fake-model", "messages": []}),
        "openai",
    ),
    ("POST", "/v1/messages", MESSAGES, "anthropic"),
    ("POST", "/v1/messages/count_tokens", MESSAGES, "anthropic"),
    ("GET", "/api/tags", None, "ollama"),
    ("POST", "/api/chat", b"{}", "ollama"),
    ("GET", "/admin/status", None, "openai"),
    ("GET", "/admin/lanes", None, "openai"),
    ("POST", "/admin/reload", None, "openai"),
    ("GET", "/ui", None, "openai"),
    ("GET", "/", None, "openai"),
    ("GET", "/metrics", None, "openai"),
    ("GET", "/healthz", None, "openai"),
]


@pytest.mark.parametrize(("method", "path", "body", "api"), ENDPOINTS)
async def test_a_foreign_host_is_refused_on_every_endpoint_in_the_callers_shape(
    fake: FakeUpstream, tmp_path: Path, method: str, path: str, body: bytes | None, api: str
) -> None:
    async with router(fake, tmp_path) as r:
        (tmp_path / "default.toml").write_text(OPEN)  # a held change a rebinder would apply
        for host in (FOREIGN, f"{FOREIGN}:{r.port}", "localhost.attacker.example"):
            status, answer = await call(
                r, method, path, body, Host=host, Authorization=f"Bearer {KEY}"
            )
            assert status == 421, (host, answer)
            if api == "anthropic":
                assert (
                    answer["type"] == "error" and "host_not_allowed" in answer["error"]["message"]
                )
            elif api == "ollama":
                assert "host_not_allowed" in answer["error"]
            else:
                assert answer["error"]["code"] == "host_not_allowed"
        assert (
            r.services.policies.attempts == 0
            and r.services.policies.current.default.require_api_key
        )
        assert fake.requests == []
        # The same request naming the router as the machine knows it is answered.
        status, _ = await call(r, "GET", "/healthz", Host=f"localhost:{r.port}")
        assert status == 200


async def test_allowed_hosts_and_an_opt_out(fake: FakeUpstream, tmp_path: Path) -> None:
    async with router(fake, tmp_path, allowed_hosts=["mybox.lan", ".corp.example"]) as r:
        for host in ("mybox.lan", "mybox.lan:8080", "gpu.corp.example"):
            status, _ = await call(r, "GET", "/healthz", Host=host)
            assert status == 200, host
        status, _ = await call(r, "GET", "/healthz", Host="other.lan")
        assert status == 421
    async with router(fake, tmp_path, allowed_hosts=["*"]) as r:
        status, _ = await call(r, "GET", "/healthz", Host=FOREIGN)
        assert status == 200


# --- CSRF: cross-site admin POSTs --------------------------------------------------------------

CROSS_SITE = [
    {"Origin": "http://evil.example"},
    {"Origin": "http://evil.example:8080", "Sec-Fetch-Site": "cross-site"},
    {"Origin": "null"},
    {"Origin": "http://localhost:3000"},  # another local program's page
    {"Origin": "http://127.0.0.1"},
    {"Sec-Fetch-Site": "cross-site"},
    {"Sec-Fetch-Site": "same-site"},  # another port of localhost, a sibling subdomain
    {"Content-Type": "text/plain"},
    {"Content-Type": "application/x-www-form-urlencoded"},
    {"Content-Type": "multipart/form-data; boundary=x"},
]


@pytest.mark.parametrize("headers", CROSS_SITE)
async def test_a_cross_site_admin_post_never_runs(
    fake: FakeUpstream, tmp_path: Path, headers: dict[str, str]
) -> None:
    async with router(fake, tmp_path) as r:
        (tmp_path / "default.toml").write_text("priority = 3\n" + CLOSED)  # narrows nothing
        status, answer = await call(r, "POST", "/admin/reload", b"x=1", **headers)
        assert status == 403 and answer["error"]["code"] == "cross_site_admin_request"
        assert r.services.policies.attempts == 0
        # ... even with the local admin token (a page cannot send one; belt and braces).
        status, _ = await call(
            r,
            "POST",
            "/admin/reload",
            b"x=1",
            **headers,
            Authorization=f"Bearer {r.services.local_token}",
        )
        assert status == 403 and r.services.policies.attempts == 0


@pytest.mark.parametrize(
    "headers",
    [
        {},
        {"Sec-Fetch-Site": "same-origin"},
        {"Sec-Fetch-Site": "none"},
        {"Content-Type": "application/json"},
    ],
)
async def test_a_same_origin_or_non_browser_admin_post_runs(
    fake: FakeUpstream, tmp_path: Path, headers: dict[str, str]
) -> None:
    async with router(fake, tmp_path) as r:
        (tmp_path / "default.toml").write_text("priority = 3\n" + CLOSED)
        headers = {**headers, "Origin": f"http://127.0.0.1:{r.port}"} if headers else headers
        status, answer = await call(r, "POST", "/admin/reload", **headers)
        assert status == 200 and answer["ok"], answer
        assert r.services.policies.current.default.priority == 3


# --- a held (widening) change needs proof ------------------------------------------------------


async def test_a_bare_loopback_post_never_applies_a_widening_change(
    fake: FakeUpstream, tmp_path: Path
) -> None:
    async with router(fake, tmp_path) as r:
        (tmp_path / "default.toml").write_text(OPEN)
        status, answer = await call(r, "POST", "/admin/reload")
        assert status == 403 and answer["error"]["code"] == "reload_needs_admin_key"
        assert "without an API key" in answer["error"]["message"]
        assert r.services.policies.current.default.require_api_key and held(r) == 1
        # A wrong bearer is no proof either.
        status, _ = await call(r, "POST", "/admin/reload", Authorization="Bearer guess")
        assert status == 403 and r.services.policies.current.default.require_api_key
        # The local admin token is.
        status, answer = await call(
            r, "POST", "/admin/reload", Authorization=f"Bearer {r.services.local_token}"
        )
        assert status == 200 and answer["ok"]
        assert not r.services.policies.current.default.require_api_key


async def test_with_an_admin_key_the_key_applies_a_widening_change(
    fake: FakeUpstream, tmp_path: Path
) -> None:
    async with router(fake, tmp_path, admin_key=ADMIN_KEY) as r:
        (tmp_path / "default.toml").write_text(OPEN)
        status, _ = await call(r, "POST", "/admin/reload")
        assert status == 401 and r.services.policies.attempts == 0
        status, answer = await call(r, "POST", "/admin/reload", Authorization=f"Bearer {ADMIN_KEY}")
        assert status == 200 and answer["ok"]
        assert not r.services.policies.current.default.require_api_key


async def test_speclane_policy_reload_applies_a_held_change(
    fake: FakeUpstream,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    runtime = tmp_path / "run"
    runtime.mkdir(mode=0o700)
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(runtime))
    monkeypatch.delenv("SPECLANE_ADMIN_KEY", raising=False)
    policies = tmp_path / "policies"
    policies.mkdir()
    async with router(fake, policies) as r:
        (policies / "default.toml").write_text(OPEN)
        r.services.policies.check(), r.services.policies.check()  # the poller holds it
        assert held(r) == 1 and r.services.policies.current.default.require_api_key
        argv = ["reload", "--url", f"http://127.0.0.1:{r.port}/v1"]
        # No token file yet (as when the router cannot write one): refused, and said why.
        assert await asyncio.to_thread(policy_main, argv) == 1
        assert "policy change held" in capsys.readouterr().err
        token_file = publish_local_token(r.services.local_token, r.port)
        assert token_file is not None and token_file.parent == runtime / "speclane"
        assert token_file.stat().st_mode & 0o777 == 0o600
        assert await asyncio.to_thread(policy_main, argv) == 0
        assert "policies reloaded: default" in capsys.readouterr().out
        assert not r.services.policies.current.default.require_api_key


# --- the same attacks from a real browser ------------------------------------------------------

CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-proxy-server",
]
EVIL = "evil.example"
# Chromium's own guard (a public page may not reach loopback) would hide the router's answer.
LNA_FEATURES = (
    "LocalNetworkAccessChecks,BlockInsecurePrivateNetworkRequests,"
    "PrivateNetworkAccessSendPreflights,PrivateNetworkAccessRespectPreflightResults"
)


def csrf_page(target: str) -> str:
    """Another site's page: a no-cors fetch, then a ``text/plain`` form that posts itself."""
    return f"""<!doctype html><title>win a prize</title>
<form id="f" method="POST" action="{target}" enctype="text/plain">
<input name='{{"a":"' value='"}}'></form>
<script>
fetch("{target}", {{method: "POST", mode: "no-cors", body: "x=1",
                    headers: {{"Content-Type": "text/plain"}}}})
  .catch(() => null).finally(() => document.getElementById("f").submit());
</script>"""


REBIND_PAGE = """<!doctype html><title>rebound</title><script>
(async () => {
  const out = {};
  for (const [method, path] of [["GET", "/admin/status"], ["GET", "/admin/lanes"],
                                ["POST", "/admin/reload"], ["GET", "/v1/models"]]) {
    try { out[method + " " + path] = (await fetch(path, {method})).status; }
    catch (e) { out[method + " " + path] = String(e); }
  }
  window.results = out;
})();
</script>"""


@pytest.mark.skipif(
    not Path(CHROMIUM).exists(), reason="needs Debian's chromium at /usr/bin/chromium"
)
async def test_in_headless_chromium_a_cross_site_form_and_a_rebound_name_change_nothing(
    fake: FakeUpstream, tmp_path: Path
) -> None:
    playwright_api = pytest.importorskip("playwright.async_api")
    from aiohttp import web

    from tests.conftest import serve_app

    async with router(fake, tmp_path) as r:
        (tmp_path / "default.toml").write_text(OPEN)
        watcher = r.services.policies
        watcher.check(), watcher.check()  # the poller held the widening change
        assert held(r) == 1
        attempts = watcher.attempts
        target = f"http://127.0.0.1:{r.port}/admin/reload"

        async def prize(_: web.Request) -> web.Response:
            return web.Response(text=csrf_page(target), content_type="text/html")

        attacker = web.Application()
        attacker.router.add_get("/", prize)
        rules = f"MAP {EVIL} 127.0.0.1, MAP {FOREIGN} 127.0.0.1"
        async with serve_app(attacker) as evil_port, playwright_api.async_playwright() as pw:
            browser = await pw.chromium.launch(
                executable_path=CHROMIUM,
                args=[
                    *CHROMIUM_ARGS,
                    f"--host-resolver-rules={rules}",
                    # a browser without local-network checks:
                    # the router must stand on its own
                    f"--disable-features={LNA_FEATURES}",
                ],
            )
            try:
                page = await browser.new_page()
                # CSRF: the form lands on the router's answer.
                await page.goto(f"http://{EVIL}:{evil_port}/")
                await page.wait_for_url(target, timeout=15_000)
                body = await page.inner_text("body")
                assert "cross_site_admin_request" in body, body
                # DNS rebinding: the attacker's name now points at 127.0.0.1; its page (served
                # while the name still pointed at the attacker) talks to it "same-origin".
                rebound = f"http://{FOREIGN}:{r.port}/attack"
                await page.route(
                    rebound, lambda route: route.fulfill(body=REBIND_PAGE, content_type="text/html")
                )
                await page.goto(rebound)
                results = await (
                    await page.wait_for_function("window.results", timeout=15_000)
                ).json_value()
            finally:
                await browser.close()
        assert results == {
            "GET /admin/status": 421,
            "GET /admin/lanes": 421,
            "POST /admin/reload": 421,
            "GET /v1/models": 421,
        }, results
        assert watcher.attempts == attempts  # no reload ran at all
        assert watcher.current.default.require_api_key


async def test_behind_a_reverse_proxy_an_allowed_origin_may_post(
    fake: FakeUpstream, tmp_path: Path
) -> None:
    """nginx passes Host: 127.0.0.1:port on; the page's origin is the public name."""
    async with router(fake, tmp_path, allowed_hosts=["speclane.example"]) as r:
        status, _ = await call(
            r,
            "POST",
            "/admin/reload",
            Origin="https://speclane.example",
            **{"Sec-Fetch-Site": "same-origin"},
        )
        assert status == 200
        status, _ = await call(r, "POST", "/admin/reload", Origin="https://other.example")
        assert status == 403


async def test_a_request_without_host_is_answered(fake: FakeUpstream, tmp_path: Path) -> None:
    """HTTP/1.0 tools may send none; every browser sends one, so nothing is rebound."""
    async with router(fake, tmp_path) as r:
        reader, writer = await asyncio.open_connection("127.0.0.1", r.port)
        writer.write(b"GET /healthz HTTP/1.0\r\n\r\n")
        answer = await reader.read()
        writer.close()
        assert answer.startswith(b"HTTP/1.0 200") or answer.startswith(b"HTTP/1.1 200"), answer
        # Two Host headers, one of them foreign: refused.
        reader, writer = await asyncio.open_connection("127.0.0.1", r.port)
        writer.write(
            b"GET /healthz HTTP/1.1\r\nHost: localhost\r\nHost: "
            + FOREIGN.encode()
            + b"\r\nConnection: close\r\n\r\n"
        )
        answer = await reader.read()
        writer.close()
        assert answer.split(b" ", 2)[1] in (b"400", b"421"), answer
