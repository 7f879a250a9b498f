"""What ``/metrics`` shows without credentials on a closed router (issue #36, class 6): every
figure, with the ``client`` label summed away; the admin key or the local admin token show the
clients. An open router names them to anyone, as before."""

from __future__ import annotations

from pathlib import Path

import aiohttp
import pytest

from tests.conftest import metric_value, router_settings, run_router
from tests.fakes.upstream import FakeUpstream

ADMIN_KEY = "admin-0123456789abcdef"
CLOSED = {
    "default.toml": 'require_api_key = true\n[match]\napi_keys = ["default-key"]\n',
    "secretproject.toml": '[match]\napi_keys = ["alice-key"]\n',
}


async def scrape(url: str, authorization: str | None = None) -> str:
    headers = {"Authorization": f"Bearer {authorization}"} if authorization else {}
    async with aiohttp.ClientSession() as s, s.get(url + "/metrics", headers=headers) as r:
        assert r.status == 200
        return await r.text()


@pytest.mark.parametrize("exposure", ["public", "loopback"])
async def test_a_closed_router_names_its_clients_only_to_its_operator(
    fake: FakeUpstream, tmp_path: Path, exposure: str
) -> None:
    for name, text in CLOSED.items():
        (tmp_path / name).write_text(text)
    settings = router_settings(
        fake, policies_dir=str(tmp_path), admin_key=ADMIN_KEY, expose_metrics=exposure
    )
    async with run_router(settings) as r:
        for key in ("alice-key", "alice-key", "default-key"):
            await r.client(api_key=key).chat.completions.create(
                model="fake-model", messages=[{"role": "user", "content": "hi"}]
            )
        anonymous = await scrape(r.url)
        wrong = await scrape(r.url, "alice-key")  # a client's key is no operator's
        admin = await scrape(r.url, ADMIN_KEY)
        token = await scrape(r.url, r.services.local_token)
    for hidden in (anonymous, wrong):
        assert "secretproject" not in hidden and 'client="' not in hidden
        decisions = metric_value(hidden, "speclane_decisions_total", lane="fake")
        assert decisions == 3  # the figures are all there, the clients summed
        assert metric_value(hidden, "speclane_queue_wait_seconds_count") == 3
        created = metric_value(admin, "speclane_decisions_total_created")
        if created is not None:  # a time: the earliest of the summed series, never a sum
            assert 0 < (metric_value(hidden, "speclane_decisions_total_created") or 0) <= created
    for shown in (admin, token):
        assert metric_value(shown, "speclane_decisions_total", client="secretproject") == 2
        assert metric_value(shown, "speclane_decisions_total", client="default") == 1


async def test_an_open_router_names_its_clients_as_before(fake: FakeUpstream) -> None:
    async with run_router(router_settings(fake)) as r:
        await r.client().chat.completions.create(
            model="fake-model", messages=[{"role": "user", "content": "hi"}]
        )
        text = await scrape(r.url)
    assert metric_value(text, "speclane_decisions_total", client="default") == 1
