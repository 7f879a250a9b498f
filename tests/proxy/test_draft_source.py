"""What body the speculative lane receives: the draft source the router chose for the
request's family, the client's own choice, plain decoding, and never for another backend."""

from __future__ import annotations

from typing import Any

import aiohttp

from router.appkeys import POOL, SPEC
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


async def test_the_lane_gets_the_source_chosen_for_the_family() -> None:
    async with fake_upstreams("spec", "batch") as (spec, batch), lanes_router(spec, batch) as r:
        assert await send(r, CHAT) == "speculative"
        assert last_body(spec)["draft_source"] == "draft_model"  # chat, a draft model runs
        assert await send(r, EDIT) == "speculative"
        assert last_body(spec)["draft_source"] == "prompt_lookup"  # a file to copy back
        assert await send(r, CHAT, tools=TOOLS) == "speculative"
        assert last_body(spec)["draft_source"] == "prompt_lookup"
        # answers held to a grammar: a free source between its forced tokens
        assert await send(r, CHAT, tools=TOOLS, tool_choice="required") == "speculative"
        assert last_body(spec)["draft_source"] == "suffix"
        json_answer = {"type": "json_schema", "json_schema": {"name": "p", "schema": {}}}
        assert await send(r, CHAT, response_format=json_answer) == "speculative"
        assert last_body(spec)["draft_source"] == "suffix"
        # the client's own choice is honoured and forwarded as sent
        assert await send(r, EDIT, extra_body={"draft_source": "draft_model"}) == "speculative"
        assert last_body(spec)["draft_source"] == "draft_model"
        # a prediction drafts from itself: nothing is asked
        await send(r, CHAT, prediction={"type": "content", "content": "hello"})
        assert "draft_source" not in last_body(spec)
        keys = set(r.app[SPEC].auto.keys())
    assert SpecKey("speculative", "fake-model", "default:none:chat", "draft_model") in keys
    assert SpecKey("speculative", "fake-model", "default:none:code-block", "prompt_lookup") in keys
    assert SpecKey("speculative", "fake-model", "default:none:code-block", "draft_model") in keys
    assert SpecKey("speculative", "fake-model", "default:none:prediction", "prediction") in keys
    assert SpecKey("speculative", "fake-model", "default:none:constrained", "suffix") in keys
    assert all("num_draft_tokens" not in s.body for s in spec.requests)
    assert not batch.requests


async def test_a_lane_without_a_draft_model_gets_prompt_lookup_for_chat() -> None:
    async with fake_upstreams("spec", "batch") as (spec, batch), lanes_router(spec, batch) as r:
        r.app[POOL]["speculative"].has_draft = False  # the gate refused the pair
        assert await send(r, CHAT) == "speculative"
        assert last_body(spec)["draft_source"] == "prompt_lookup"


async def test_plain_decoding_asks_for_no_source() -> None:
    """Speculation off for the workload, and no batching lane to go to: the speculative lane
    decodes plainly, with ``num_draft_tokens: 0`` and no ``draft_source``."""
    stats = {
        "drafted": 9,
        "accepted": 1,
        "rejected": 8,
        "steps": 3,
        "num_draft_tokens": 3,
        "source": "prompt_lookup",
    }
    async with fake_upstreams("spec") as (spec,):
        spec.behaviour = Behaviour(usage_extra={"speclane_spec": stats})
        # one source (under auto, code-block would fall back on the draft model)
        settings = router_settings(
            backends=[], spec=LOW, lanes={"enabled": False, "draft_source": "prompt_lookup"}
        )
        async with run_router(
            settings, setup=lambda app: add_fake_lane(app, "speculative", spec)
        ) as r:
            await send(r, EDIT)
            assert last_body(spec)["draft_source"] == "prompt_lookup"
            key = SpecKey("speculative", "fake-model", "default:none:code-block", "prompt_lookup")
            assert not r.app[SPEC].auto.enabled(key)
            assert await send(r, EDIT) == "speculative"
    body = last_body(spec)
    assert body["num_draft_tokens"] == 0 and "draft_source" not in body


async def test_an_external_backend_never_gets_a_draft_source() -> None:
    async with fake_upstreams("ext") as (ext,):
        backends = [
            {"name": "ext", "kind": "llamacpp", "base_url": ext.base_url, "speculative": True}
        ]
        async with run_router(router_settings(backends=backends)) as r:
            assert await send(r, EDIT) == "ext"
            assert await send(r, CHAT) == "ext"
            keys = set(r.app[SPEC].auto.keys())
    assert all("draft_source" not in s.body for s in ext.requests)
    assert SpecKey("ext", "fake-model", "default:none:code-block", "draft_model") in keys


async def test_the_batching_lane_gets_its_own_source_and_is_judged_apart() -> None:
    """The batching lane drafts from the free sources: the router names one per family, and
    auto-disable judges it under the batching lane's own key (metrics ``backend="batching"``);
    once off there, the lane decodes plainly (``num_draft_tokens: 0``)."""
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
            settings, setup=lambda app: add_fake_lane(app, "batching", batch)
        ) as r:
            assert await send(r, EDIT) == "batching"
            assert last_body(batch)["draft_source"] == "prompt_lookup"
            key = SpecKey("batching", "fake-model", "default:none:code-block", "prompt_lookup")
            assert key in set(r.app[SPEC].auto.keys())
            assert not r.app[SPEC].auto.enabled(key)  # low acceptance: off on this lane
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
