"""Upstream errors relayed in the OpenAI shape, keeping what the upstream said."""

from __future__ import annotations

import aiohttp
import orjson
import pytest

from router.kernel.errors import dump_body, from_upstream_body
from tests.conftest import router_settings, run_router
from tests.fakes.replay import ReplayUpstream, load

# llama-server's own error body (501, "code": 501 as a number), captured.
LLAMACPP_ERROR = "llamacpp-server_metrics_without--metrics.http"


def test_an_integer_code_stays_an_integer() -> None:
    cap = load(LLAMACPP_ERROR)
    err = from_upstream_body(cap.status, cap.body)
    assert err.status == 501 and err.code == 501 and err.type == "not_supported_error"
    assert orjson.loads(dump_body(err))["error"]["code"] == 501


@pytest.mark.parametrize(
    ("code", "relayed"),
    [
        ("context_length_exceeded", "context_length_exceeded"),
        (True, "True"),  # a bool is not a number here
        (1.5, "1.5"),
        ({"nested": 1}, "{'nested': 1}"),
        ("x" * 5000, "x" * 200),
    ],
)
def test_other_codes_become_bounded_strings(code: object, relayed: str) -> None:
    err = from_upstream_body(400, orjson.dumps({"error": {"message": "m", "code": code}}))
    assert err.code == relayed


async def test_llama_server_error_code_is_relayed_as_a_number() -> None:
    async with ReplayUpstream(
        load(LLAMACPP_ERROR), gets={"/v1/models": load("llamacpp-server_v1-models.json")}
    ) as up:
        settings = router_settings(
            backends=[{"name": "l", "kind": "llamacpp", "base_url": up.base_url, "models": ["m"]}]
        )
        async with run_router(settings) as r, aiohttp.ClientSession() as s:
            async with s.post(
                f"{r.base_url}/chat/completions",
                json={"model": "m", "messages": [{"role": "user", "content": "hi"}]},
            ) as resp:
                assert resp.status == 501
                error = (await resp.json())["error"]
    assert error["code"] == 501 and isinstance(error["code"], int)
    assert error["message"].startswith("This server does not support metrics endpoint")
