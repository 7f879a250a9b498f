"""Credentials that disagree are a 400 on every door, in the door's own error shape: two
different ``Authorization`` values, two different ``x-api-key`` values, or a bearer token
and an ``x-api-key`` that differ (a gateway in front reading the other one would disagree
about who the caller is). The same value twice is one credential."""

from __future__ import annotations

from typing import Any

import aiohttp
import pytest
from multidict import CIMultiDict

from router.kernel.errors import RouterError
from router.proxy.credentials import presented_key
from tests.conftest import router_settings, run_router
from tests.fakes.upstream import FakeUpstream

HI = [{"role": "user", "content": "hi"}]
DOORS: dict[str, tuple[str, dict[str, Any]]] = {
    "openai": ("/v1/chat/completions", {"model": "fake-model", "messages": HI}),
    "anthropic": ("/v1/messages", {"model": "fake-model", "max_tokens": 8, "messages": HI}),
    "ollama": ("/api/chat", {"model": "fake-model", "messages": HI, "stream": False}),
}
CONFLICTS = {
    "two_authorizations": [("Authorization", "Bearer key-a"), ("Authorization", "Bearer key-b")],
    "two_api_keys": [("x-api-key", "key-a"), ("x-api-key", "key-b")],
    "bearer_and_api_key": [("Authorization", "Bearer key-a"), ("x-api-key", "key-b")],
    "bearer_and_other_scheme": [("Authorization", "Bearer key-a"), ("Authorization", "Basic a")],
}
AGREEING = {
    "same_authorization_twice": [("Authorization", "Bearer key-a")] * 2,
    "same_api_key_twice": [("x-api-key", "key-a")] * 2,
    "bearer_and_same_api_key": [("Authorization", "Bearer key-a"), ("x-api-key", "key-a")],
}


def conflict_code(door: str, body: Any) -> str:
    """The error code of a door's error body (checked to be in that door's shape)."""
    if door == "openai":
        assert set(body) == {"error"} and set(body["error"]) == {
            "message",
            "type",
            "param",
            "code",
        }, body
        return str(body["error"]["code"])
    if door == "anthropic":
        assert body["type"] == "error" and body["error"]["type"] == "invalid_request_error"
        message = body["error"]["message"]
    else:
        assert set(body) == {"error"} and isinstance(body["error"], str), body
        message = body["error"]
    return str(message).split("]")[0].lstrip("[")


@pytest.mark.parametrize("door", sorted(DOORS))
async def test_conflicting_credentials_are_a_400_in_the_doors_shape(
    fake: FakeUpstream, door: str
) -> None:
    path, body = DOORS[door]
    async with run_router(router_settings(fake)) as r, aiohttp.ClientSession() as s:
        for name, headers in CONFLICTS.items():
            async with s.post(f"{r.url}{path}", json=body, headers=CIMultiDict(headers)) as resp:
                assert resp.status == 400, (name, await resp.text())
                assert conflict_code(door, await resp.json()) == "conflicting_credentials", name
        for name, headers in AGREEING.items():
            async with s.post(f"{r.url}{path}", json=body, headers=CIMultiDict(headers)) as resp:
                assert resp.status == 200, (name, await resp.text())
    assert len(fake.requests) == len(AGREEING)  # no conflicting request went upstream
    # Booked like any refusal.
    booked = [rec for rec in r.services.access.recent if rec.status == 400]
    assert len(booked) == len(CONFLICTS)
    assert all(rec.error and rec.error.startswith("conflicting_credentials") for rec in booked)


@pytest.mark.parametrize(
    ("authorizations", "api_keys", "use_api_key", "key"),
    [
        ([], [], False, None),
        (["Bearer a"], [], False, "a"),
        (["Bearer a", " Bearer a "], [], False, "a"),
        ([], ["a"], False, None),  # the OpenAI door reads no x-api-key...
        ([], ["a"], True, "a"),  # ...Anthropic's does
        (["Bearer a"], ["a", "a"], True, "a"),
        (["Basic xyz"], ["a"], True, "a"),  # not a key: nothing to disagree with
    ],
)
def test_presented_key(
    authorizations: list[str], api_keys: list[str], use_api_key: bool, key: str | None
) -> None:
    assert presented_key(authorizations, api_keys, use_api_key_header=use_api_key) == key


@pytest.mark.parametrize(
    ("authorizations", "api_keys"),
    [
        (["Bearer a", "Bearer b"], []),
        ([], ["a", "b"]),
        (["Bearer a"], ["b"]),
        (["Bearer a", "Basic a"], []),
    ],
)
@pytest.mark.parametrize("use_api_key", [False, True])
def test_presented_key_refuses_a_disagreement(
    authorizations: list[str], api_keys: list[str], use_api_key: bool
) -> None:
    with pytest.raises(RouterError) as info:
        presented_key(authorizations, api_keys, use_api_key_header=use_api_key)
    assert (info.value.status, info.value.code) == (400, "conflicting_credentials")


async def test_admin_endpoints_refuse_two_different_authorizations(fake: FakeUpstream) -> None:
    async with (
        run_router(router_settings(fake, admin_key="s3cret")) as r,
        aiohttp.ClientSession() as s,
    ):
        url = f"{r.url}/admin/status"
        right, wrong = ("Authorization", "Bearer s3cret"), ("Authorization", "Bearer nope")
        for order in ([right, wrong], [wrong, right]):
            async with s.get(url, headers=CIMultiDict(order)) as resp:
                assert resp.status == 400, await resp.text()
                assert conflict_code("openai", await resp.json()) == "conflicting_credentials"
        async with s.get(url, headers=CIMultiDict([right, right])) as resp:
            assert resp.status == 200
