"""Compaction on the Responses door: a final ``compaction_trigger`` item and
``POST /v1/responses/compact`` answer one compaction item holding the model's summary, and a
compaction item sent back becomes that summary (the official openai SDK, a loopback fake
upstream)."""

from __future__ import annotations

from typing import Any

import aiohttp
import openai
import pytest

from router.frontdoors import responses_compact
from router.frontdoors.responses_in import to_openai
from router.kernel.errors import RouterError
from tests.conftest import router_settings, run_router
from tests.fakes.upstream import FakeUpstream

MODEL = "fake-model"
ANSWER = "w0 w1 w2 w3 w4"  # what the fake upstream answers
TOOLS: list[Any] = [{"type": "function", "name": "shell", "parameters": {"type": "object"}}]
HISTORY: list[Any] = [
    {"role": "user", "content": "Fix the failing test."},
    {"type": "function_call", "call_id": "c1", "name": "shell", "arguments": "{}"},
    {"type": "function_call_output", "call_id": "c1", "output": "1 failed"},
]


def test_a_summary_survives_its_round_trip_through_an_item() -> None:
    item = responses_compact.item("done: a; next: b ü")
    assert item["type"] == "compaction" and item["id"].startswith("cmp_")
    assert responses_compact.decode(item, "input[0]") == "done: a; next: b ü"


@pytest.mark.parametrize("content", [None, 7, "gAAAA-openai-opaque", "speclane-compaction-1:%%%"])
def test_a_compaction_item_speclane_did_not_make_is_refused(content: Any) -> None:
    with pytest.raises(RouterError) as e:
        to_openai({"model": MODEL, "input": [{"type": "compaction", "encrypted_content": content}]})
    assert e.value.status == 400 and e.value.code == "invalid_encrypted_content"


def test_a_trigger_before_the_end_is_refused() -> None:
    with pytest.raises(RouterError) as e:
        to_openai({"model": MODEL, "input": [{"type": "compaction_trigger"}, *HISTORY]})
    assert e.value.status == 400 and e.value.param == "input[0]"


def test_a_trigger_asks_for_a_summary_with_the_prompt_prefix_unchanged() -> None:
    turn = {"model": MODEL, "input": HISTORY, "tools": TOOLS, "tool_choice": "auto"}
    plain = to_openai(turn)
    req = to_openai({**turn, "input": [*HISTORY, {"type": "compaction_trigger"}]})
    assert req.compaction and not req.store
    messages = req.openai["messages"]
    assert messages[-1] == {"role": "user", "content": responses_compact.PROMPT}
    assert messages[-2] == {"role": "tool", "tool_call_id": "c1", "content": "1 failed"}
    # The same tools and messages before the summary's ask: the prompt cache holds them.
    assert messages[:-1] == plain.openai["messages"]
    assert (req.openai["tools"], req.openai["tool_choice"]) == (plain.openai["tools"], "auto")


async def test_a_streamed_trigger_answers_one_compaction_item(fake: FakeUpstream) -> None:
    async with run_router(router_settings(fake)) as r:
        async with r.client().responses.stream(
            model=MODEL, input=[*HISTORY, {"type": "compaction_trigger"}], tools=TOOLS
        ) as stream:
            events = [event async for event in stream]
            final = await stream.get_final_response()
    kinds = [e.type for e in events]
    assert "response.output_text.delta" not in kinds  # the summary is the item, not text
    assert kinds[-3:] == [
        "response.output_item.added",
        "response.output_item.done",
        "response.completed",
    ]
    assert [item.type for item in final.output] == ["compaction"]
    summary = responses_compact.decode(final.output[0].model_dump(), "output[0]")
    assert summary == ANSWER
    sent = fake.requests[0].body
    assert sent["messages"][-1]["content"] == responses_compact.PROMPT
    assert sent["tools"] and sent["stream"] is True


async def test_the_item_sent_back_becomes_the_summary(fake: FakeUpstream) -> None:
    async with run_router(router_settings(fake)) as r:
        client = r.client()
        compacted = await client.responses.create(
            model=MODEL, input=[*HISTORY, {"type": "compaction_trigger"}]
        )
        item = compacted.output[0].model_dump(exclude_none=True)
        after = await client.responses.create(
            model=MODEL, input=[item, {"role": "user", "content": "Go on."}]
        )
    assert after.output_text == ANSWER
    assert fake.requests[1].body["messages"] == [
        {"role": "user", "content": responses_compact.PREAMBLE + ANSWER},
        {"role": "user", "content": "Go on."},
    ]


async def test_the_compact_endpoint_answers_the_user_messages_and_one_item(
    fake: FakeUpstream,
) -> None:
    async with run_router(router_settings(fake)) as r:
        compacted = await r.client().responses.compact(
            model=MODEL, input=HISTORY, instructions="You are a coding agent."
        )
        async with aiohttp.ClientSession() as s:
            async with s.post(f"{r.url}/v1/responses/compact", json={"input": "x"}) as resp:
                refused = (resp.status, await resp.json())
    assert compacted.object == "response.compaction" and compacted.id.startswith("resp_")
    assert [o.type for o in compacted.output] == ["message", "compaction"]
    assert (
        compacted.output[0].model_dump(warnings=False)["content"][0]["text"]
        == "Fix the failing test."
    )
    assert responses_compact.decode(compacted.output[1].model_dump(), "output[1]") == ANSWER
    assert compacted.usage.output_tokens == 5
    sent = fake.requests[0].body
    assert sent.get("stream") is not True
    assert sent["messages"][0] == {"role": "system", "content": "You are a coding agent."}
    assert sent["messages"][-1]["content"] == responses_compact.PROMPT
    assert refused[0] == 400 and refused[1]["error"]["param"] == "model"


async def test_a_forged_item_is_a_400_in_openai_shape(fake: FakeUpstream) -> None:
    async with run_router(router_settings(fake)) as r:
        with pytest.raises(openai.BadRequestError) as e:
            await r.client().responses.create(
                model=MODEL, input=[{"type": "compaction", "encrypted_content": "gAAAA"}]
            )
    assert e.value.code == "invalid_encrypted_content" and not fake.requests


async def test_a_second_compaction_does_not_repeat_the_first_summary(fake: FakeUpstream) -> None:
    earlier = responses_compact.item("first summary")
    async with run_router(router_settings(fake)) as r:
        compacted = await r.client().responses.compact(
            model=MODEL, input=[earlier, {"role": "user", "content": "Go on."}]
        )
    texts = [o.model_dump(warnings=False).get("content") for o in compacted.output[:-1]]
    assert [t[0]["text"] for t in texts] == ["Go on."]
    assert fake.requests[0].body["messages"][0]["content"].endswith("first summary")
