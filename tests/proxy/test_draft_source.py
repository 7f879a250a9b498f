"""What body the speculative lane receives: ``auto`` (the lane chooses the source at every
step) or the configured source, the client's own choice, plain decoding, and never for
another backend."""

from __future__ import annotations

from typing import Any

import aiohttp
import pytest

from router.speculation.keystate import SpecKey
from tests.conftest import (
    add_fake_lane,
    fake_upstreams,
    lanes_router,
    router_settings,
    run_router,
)
from tests.fakes.upstream import Behaviour, FakeUpstream

CODE = (
    "Fix the bug in this file:\n```python\n"
    + "".join(f"def f{i}(x):\n    return x + {i}\n" for i in range(6))
    + "```\n"
)
CHAT = [{"role": "user", "content": "hi"}]
EDIT = [{"role": "user", "content": CODE}]
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "read_file",
            "parameters": {"type": "object", "properties": {"path": {"type": "string"}}},
        },
    }
]
# Low acceptance over enough drafted tokens to judge: the workload turns off at once.
LOW = {
    "window_size": 16,
    "min_sample": 8,
    "off_threshold": 0.3,
    "on_threshold": 0.45,
    "probe_initial": 60.0,
    "baseline_spacing": 0,
}


async def send(r: Any, messages: list[dict[str, Any]], **extra: Any) -> str:
    resp = await r.client().chat.completions.with_raw_response.create(
        model="fake-model", messages=messages, **extra
    )
    return resp.headers["x-speclane-backend"]


def last_body(fake: FakeUpstream) -> dict[str, Any]:
    return fake.requests[-1].body


async def test_under_auto_the_lane_is_asked_to_choose_for_every_family() -> None:
    async with fake_upstreams("spec", "batch") as (spec, batch), lanes_router(spec, batch) as r:
        # chat, a file to copy back, tool calls, answers held to a grammar: the lane chooses
        assert await send(r, CHAT) == "speculative"
        assert last_body(spec)["draft_source"] == "auto"
        assert await send(r, EDIT) == "speculative"
        assert last_body(spec)["draft_source"] == "auto"
        assert await send(r, CHAT, tools=TOOLS) == "speculative"
        assert last_body(spec)["draft_source"] == "auto"
        assert await send(r, CHAT, tools=TOOLS, tool_choice="required") == "speculative"
        assert last_body(spec)["draft_source"] == "auto"
        json_answer = {"type": "json_schema", "json_schema": {"name": "p", "schema": {}}}
        assert await send(r, CHAT, response_format=json_answer) == "speculative"
        assert last_body(spec)["draft_source"] == "auto"
        # the client's own choice is honoured and forwarded as sent
        assert await send(r, EDIT, extra_body={"draft_source": "draft_model"}) == "speculative"
        assert last_body(spec)["draft_source"] == "draft_model"
        # a prediction drafts from itself: nothing is asked
        await send(r, CHAT, prediction={"type": "content", "content": "hello"})
        assert "draft_source" not in last_body(spec)
        keys = set(r.services.spec.auto.keys())
    # one source under auto, each family judged under its own key
    assert SpecKey("speculative", "fake-model", "default:none:chat", "auto") in keys
    assert SpecKey("speculative", "fake-model", "default:none:code-block", "auto") in keys
    assert SpecKey("speculative", "fake-model", "default:none:tools", "auto") in keys
    assert SpecKey("speculative", "fake-model", "default:none:constrained", "auto") in keys
    assert SpecKey("speculative", "fake-model", "default:none:code-block", "draft_model") in keys
    assert SpecKey("speculative", "fake-model", "default:none:prediction", "prediction") in keys
    assert all("num_draft_tokens" not in s.body for s in spec.requests)
    assert not batch.requests


async def test_a_lane_without_a_draft_model_is_still_asked_to_choose() -> None:
    """The gate refused the pair: under auto the lane chooses among its free sources; a
    fixed ``draft_model`` then asks for nothing."""
    async with fake_upstreams("spec", "batch") as (spec, batch), lanes_router(spec, batch) as r:
        r.services.pool["speculative"].has_draft = False
        assert await send(r, CHAT) == "speculative"
        assert last_body(spec)["draft_source"] == "auto"
    async with (
        fake_upstreams("spec", "batch") as (spec, batch),
        lanes_router(spec, batch, lanes={"enabled": False, "draft_source": "draft_model"}) as r,
    ):
        r.services.pool["speculative"].has_draft = False
        assert await send(r, CHAT) == "speculative"
        assert "draft_source" not in last_body(spec)


@pytest.mark.parametrize("configured", ["prompt_lookup", "auto"])
async def test_plain_decoding_asks_for_no_source(configured: str) -> None:
    """A fixed source kept one time in nine turns the workload off, and with no batching
    lane to go to the speculative lane decodes plainly (``num_draft_tokens: 0``, no
    ``draft_source``). Under ``auto`` the same figures turn nothing off: the lane drafted
    only what it measured to pay, and is asked to choose again."""
    stats = {
        "drafted": 9,
        "accepted": 1,
        "rejected": 8,
        "steps": 3,
        "num_draft_tokens": 3,
        "source": configured,
    }
    async with fake_upstreams("spec") as (spec,):
        spec.behaviour = Behaviour(usage_extra={"speclane_spec": stats})
        settings = router_settings(
            backends=[], spec=LOW, lanes={"enabled": False, "draft_source": configured}
        )
        async with run_router(
            settings, setup=lambda wired: add_fake_lane(wired, "speculative", spec)
        ) as r:
            await send(r, EDIT)
            assert last_body(spec)["draft_source"] == configured
            key = SpecKey("speculative", "fake-model", "default:none:code-block", configured)
            assert r.services.spec.auto.enabled(key) is (configured == "auto")
            assert await send(r, EDIT) == "speculative"
    body = last_body(spec)
    if configured == "auto":
        assert body["draft_source"] == "auto" and "num_draft_tokens" not in body
    else:
        assert body["num_draft_tokens"] == 0 and "draft_source" not in body


async def test_an_external_backend_never_gets_a_draft_source() -> None:
    async with fake_upstreams("ext") as (ext,):
        backends = [
            {"name": "ext", "kind": "llamacpp", "base_url": ext.base_url, "speculative": True}
        ]
        async with run_router(router_settings(backends=backends)) as r:
            assert await send(r, EDIT) == "ext"
            assert await send(r, CHAT) == "ext"
            keys = set(r.services.spec.auto.keys())
    assert all("draft_source" not in s.body for s in ext.requests)
    assert SpecKey("ext", "fake-model", "default:none:code-block", "draft_model") in keys


async def test_the_batching_lane_gets_its_own_source_and_is_judged_apart() -> None:
    """The batching lane drafts from the free sources: the router names the configured one
    (``auto`` by default: the lane chooses), and auto-disable judges it under the batching
    lane's own key (metrics ``backend="batching"``); once off there, the lane decodes plainly
    (``num_draft_tokens: 0``)."""
    stats = {
        "drafted": 9,
        "accepted": 1,
        "rejected": 8,
        "steps": 3,
        "num_draft_tokens": 6,
        "source": "prompt_lookup",
    }
    async with fake_upstreams("batch") as (batch,):
        batch.behaviour = Behaviour(usage_extra={"speclane_spec": stats})
        settings = router_settings(
            backends=[], spec=LOW, lanes={"enabled": False, "draft_source": "prompt_lookup"}
        )
        async with run_router(
            settings, setup=lambda wired: add_fake_lane(wired, "batching", batch)
        ) as r:
            assert await send(r, EDIT) == "batching"
            assert last_body(batch)["draft_source"] == "prompt_lookup"
            key = SpecKey("batching", "fake-model", "default:none:code-block", "prompt_lookup")
            assert key in set(r.services.spec.auto.keys())
            assert not r.services.spec.auto.enabled(key)  # low acceptance: off on this lane
            async with aiohttp.ClientSession() as s, s.get(f"{r.url}/metrics") as resp:
                metrics = await resp.text()
            await send(r, EDIT)
            off = last_body(batch)
            # a prediction drafts from itself there too: nothing asked
            await send(r, CHAT, prediction={"type": "content", "content": "hello"})
            predicted = last_body(batch)
    assert off["num_draft_tokens"] == 0 and "draft_source" not in off
    assert "draft_source" not in predicted and "num_draft_tokens" not in predicted
    assert 'speclane_spec_draft_tokens_total{backend="batching"' in metrics
