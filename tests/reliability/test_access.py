"""Who may use the router: API keys per client, admin endpoints, /metrics, the exposure warning.

Non-loopback access is tested for real: the router binds to an address of this machine that
is not loopback and the client connects through it, so the router sees a remote peer. Those
tests are skipped on a machine with no such address.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from router.app import wire
from router.server import warn_if_exposed
from tests.conftest import fake_upstreams, router_settings
from tests.fakes.upstream import FakeUpstream
from tests.reliability.harness import (
    TALLY,
    RouterProcess,
    Served,
    assert_openai_error,
    chat_body,
    config_text,
    non_loopback_ipv4,
    post_stream,
    serve_app,
)

ADMIN_KEY = "admin-0123456789abcdef"
ALICE_KEY = "sk-alice-0123456789"
DEFAULT_KEY = "sk-default-0123456789"
REMOTE_IP = non_loopback_ipv4()
needs_remote = pytest.mark.skipif(REMOTE_IP is None, reason="no non-loopback address here")
ADMIN = [("GET", "/admin/lanes"), ("GET", "/admin/spec"), ("POST", "/admin/reload")]


@asynccontextmanager
async def router(
    tmp_path: Path,
    host: str = "127.0.0.1",
    policies: dict[str, str] | None = None,
    **overrides: Any,
) -> AsyncIterator[tuple[Served, FakeUpstream]]:
    for name, text in (policies or {}).items():
        (tmp_path / name).write_text(text)
    async with fake_upstreams("fake") as (fake,):
        settings = router_settings(fake, policies_dir=str(tmp_path), **overrides)
        async with serve_app(settings, host) as served:
            yield served, fake


async def call(
    s: aiohttp.ClientSession,
    method: str,
    url: str,
    key: str | None = None,
    headers: dict[str, str] | None = None,
    **kw: Any,
) -> tuple[int, Any, dict[str, str]]:
    headers = {**(headers or {}), **({"Authorization": f"Bearer {key}"} if key else {})}
    async with s.request(method, url, headers=headers, **kw) as resp:
        text = await resp.text()
        ctype = resp.headers.get("Content-Type", "")
        body = await resp.json() if ctype.startswith("application/json") else text
        return resp.status, body, dict(resp.headers)


def refused(status: int, body: Any, expected: int, code: str | None = None) -> None:
    assert status == expected, (status, body)
    err = assert_openai_error(body)
    if code is not None:
        assert err["code"] == code, err
    TALLY.fault("access_refused")


# --- API keys per client ----------------------------------------------------------------------

CLOSED = {
    "default.toml": f'require_api_key = true\n[match]\napi_keys = ["{DEFAULT_KEY}"]\n',
    "alice.toml": f'require_api_key = true\n[match]\napi_keys = ["{ALICE_KEY}"]\n'
    'client_header = ["alice"]\n',
}


async def test_a_router_that_requires_keys_lets_no_stranger_in(tmp_path: Path) -> None:
    async with router(tmp_path, policies=CLOSED) as (r, fake), aiohttp.ClientSession() as s:
        url = f"{r.base_url}/chat/completions"
        for stream in (False, True):
            body = chat_body(stream=stream)
            reached = len(fake.requests)
            status, err, headers = await call(s, "POST", url, json=body)
            refused(status, err, 401, "missing_api_key")
            assert headers["WWW-Authenticate"] == "Bearer"
            refused(
                *(await call(s, "POST", url, "sk-guess", json=body))[:2], 401, "invalid_api_key"
            )
            # A client header is a label, not a proof.
            status, err, _ = await call(
                s, "POST", url, json=body, headers={"X-Speclane-Client": "alice"}
            )
            refused(status, err, 401)
            assert len(fake.requests) == reached  # no refused request reached the backend
            for key, client in ((ALICE_KEY, "alice"), (DEFAULT_KEY, "default")):
                res = await post_stream(s, url, body, {"Authorization": f"Bearer {key}"})
                assert res.status == 200 and res.headers["X-Speclane-Client"] == client
        assert len(fake.requests) == 4  # only the four requests with a valid key


async def test_model_list_requires_a_key_when_the_router_does(tmp_path: Path) -> None:
    async with router(tmp_path, policies=CLOSED) as (r, _), aiohttp.ClientSession() as s:
        status, body, _ = await call(s, "GET", f"{r.base_url}/models")
        refused(status, body, 401, "missing_api_key")
        status, _, _ = await call(s, "GET", f"{r.base_url}/models", ALICE_KEY)
        assert status == 200


# --- admin endpoints ---------------------------------------------------------------------------


async def test_admin_endpoints_need_the_admin_key_when_one_is_set(tmp_path: Path) -> None:
    async with (
        router(tmp_path, policies={"alice.toml": CLOSED["alice.toml"]}, admin_key=ADMIN_KEY) as (
            r,
            _,
        ),
        aiohttp.ClientSession() as s,
    ):
        for method, path in ADMIN:
            url = f"{r.url}{path}"
            status, body, headers = await call(s, method, url)
            refused(status, body, 401, "missing_admin_key")
            assert headers["WWW-Authenticate"] == "Bearer"
            refused(*(await call(s, method, url, "wrong-key"))[:2], 403, "invalid_admin_key")
            # A client's API key is not an admin key.
            refused(*(await call(s, method, url, ALICE_KEY))[:2], 403, "invalid_admin_key")
            status, body, _ = await call(s, method, url, ADMIN_KEY)
            assert status == 200, body


async def test_reload_through_the_admin_endpoint(tmp_path: Path) -> None:
    async with router(tmp_path, admin_key=ADMIN_KEY) as (r, _), aiohttp.ClientSession() as s:
        (tmp_path / "bob.toml").write_text('[match]\nclient_header = ["bob"]\n')
        status, body, _ = await call(s, "POST", f"{r.url}/admin/reload", ADMIN_KEY)
        assert status == 200 and body["ok"] and "bob" in body["clients"]
        (tmp_path / "broken.toml").write_text("client = [")
        status, body, _ = await call(s, "POST", f"{r.url}/admin/reload", ADMIN_KEY)
        assert status == 422 and not body["ok"] and "broken.toml" in body["error"]


@needs_remote
async def test_without_an_admin_key_admin_endpoints_answer_loopback_only(tmp_path: Path) -> None:
    assert REMOTE_IP is not None
    async with router(tmp_path, host="0.0.0.0") as (r, _), aiohttp.ClientSession() as s:
        for method, path in ADMIN:
            status, body, _ = await call(s, method, f"http://{REMOTE_IP}:{r.port}{path}")
            refused(status, body, 403, "admin_loopback_only")
            status, body, _ = await call(s, method, f"http://127.0.0.1:{r.port}{path}")
            assert status == 200, body


@needs_remote
async def test_with_an_admin_key_admin_endpoints_answer_remote_clients_with_it(
    tmp_path: Path,
) -> None:
    async with (
        router(tmp_path, host=REMOTE_IP, admin_key=ADMIN_KEY) as (r, _),
        aiohttp.ClientSession() as s,
    ):
        for method, path in ADMIN:
            url = f"{r.url}{path}"
            refused(*(await call(s, method, url))[:2], 401, "missing_admin_key")
            status, body, _ = await call(s, method, url, ADMIN_KEY)
            assert status == 200, body


# --- /metrics exposure ------------------------------------------------------------------------


@needs_remote
@pytest.mark.parametrize(
    ("exposure", "remote", "local"),
    [
        ("public", 200, 200),
        ("loopback", 403, 200),
        ("admin", 403, 200),  # no admin_key configured: loopback only, like /admin/*
        ("off", 404, 404),
    ],
)
async def test_metrics_exposure(tmp_path: Path, exposure: str, remote: int, local: int) -> None:
    async with (
        router(tmp_path, host="0.0.0.0", expose_metrics=exposure) as (r, _),
        aiohttp.ClientSession() as s,
    ):
        got_remote = await call(s, "GET", f"http://{REMOTE_IP}:{r.port}/metrics")
        got_local = await call(s, "GET", f"http://127.0.0.1:{r.port}/metrics")
    assert (got_remote[0], got_local[0]) == (remote, local)
    for status, body, _ in (got_remote, got_local):
        if status == 200:
            assert "speclane_requests_total" in body
        else:
            refused(status, body, status)


async def test_metrics_exposed_to_admins_only(tmp_path: Path) -> None:
    async with (
        router(tmp_path, expose_metrics="admin", admin_key=ADMIN_KEY) as (r, _),
        aiohttp.ClientSession() as s,
    ):
        refused(*(await call(s, "GET", f"{r.url}/metrics"))[:2], 401, "missing_admin_key")
        status, body, _ = await call(s, "GET", f"{r.url}/metrics", ADMIN_KEY)
    assert status == 200 and "speclane_requests_total" in body


# --- the warning when exposed without keys ------------------------------------------------------


@pytest.mark.parametrize(
    ("host", "policies", "admin_key", "warns"),
    [
        ("127.0.0.1", {}, None, False),
        ("0.0.0.0", {}, None, True),  # nobody needs a key: loud
        ("0.0.0.0", {"default.toml": CLOSED["default.toml"]}, None, True),  # no admin key
        ("0.0.0.0", {}, ADMIN_KEY, True),  # clients need no key
        ("0.0.0.0", {"default.toml": CLOSED["default.toml"]}, ADMIN_KEY, False),
        # A closed default: a key-less policy that a header selects opens nothing either.
        (
            "0.0.0.0",
            {
                "default.toml": CLOSED["default.toml"],
                "open.toml": '[match]\nclient_header = ["open"]\n',
            },
            ADMIN_KEY,
            False,
        ),
    ],
)
def test_exposure_warning(
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    host: str,
    policies: dict[str, str],
    admin_key: str | None,
    warns: bool,
) -> None:
    for name, text in policies.items():
        (tmp_path / name).write_text(text)
    settings = router_settings(host=host, policies_dir=str(tmp_path), admin_key=admin_key)
    warn_if_exposed(settings, wire(settings).services)
    err = capsys.readouterr().err
    assert ("WARNING: speclane is listening on" in err) is warns, err


@needs_remote
async def test_serve_on_a_network_address_without_keys_prints_a_prominent_warning(
    tmp_path: Path,
) -> None:
    assert REMOTE_IP is not None
    (tmp_path / "policies").mkdir()
    config = tmp_path / "speclane.toml"
    config.write_text(config_text(policies_dir=str(tmp_path / "policies"), host=REMOTE_IP))
    proc = await RouterProcess.start(config, "--no-lanes")
    assert await proc.stop() == 0  # stop() also collects all of stderr
    err = "".join(proc.stderr)
    assert "!" * 40 in err and f"WARNING: speclane is listening on {REMOTE_IP}" in err
    assert "require_api_key" in err and "admin_key" in err


def test_exposure_warning_names_what_a_keyless_request_gets(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The warning and identification share one rule: the policies it names are exactly
    those a request without a key can be served under."""
    (tmp_path / "open.toml").write_text('[match]\nclient_header = ["open"]\n')
    (tmp_path / "alice.toml").write_text(CLOSED["alice.toml"])
    settings = router_settings(host="0.0.0.0", policies_dir=str(tmp_path), admin_key=ADMIN_KEY)
    services = wire(settings).services
    warn_if_exposed(settings, services)
    err = capsys.readouterr().err
    keyless = services.policies.current.keyless()
    assert {p.client for p in keyless} == {"default", "open"}
    assert "open policies: " + ", ".join(p.client for p in keyless) in err
    assert "alice" not in err
