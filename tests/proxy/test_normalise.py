"""Prompt normalisation (router/proxy/normalise.py), on the real programs' captured request
bodies (tests/fixtures/agent-prompts/, written by tests/clients/capture_prompts.py), then
through the router with the official clients."""

from __future__ import annotations

import copy
import itertools
import json
from pathlib import Path
from typing import Any

import anthropic
import pytest

from router.config.names import PROMPT_RULES
from router.frontdoors import anthropic_in
from router.proxy.normalise import normalise
from tests.conftest import metric_value, router_settings, run_router
from tests.fakes.upstream import FakeUpstream, fake_upstream

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures" / "agent-prompts"
BILLING = "x-anthropic-billing-header:"
DATE = "Tuesday, December 1, 2026"  # the day the fixtures were captured


def captured(name: str) -> list[dict[str, Any]]:
    return json.loads((FIXTURES / f"{name}.json").read_text())


def claude_messages(name: str, i: int = 0) -> list[dict[str, Any]]:
    """Claude Code's i-th request of a conversation, as the Anthropic door translates it."""
    return anthropic_in.to_openai(captured(name)[i]).openai["messages"]


def qwen_messages(name: str, i: int) -> list[dict[str, Any]]:
    return captured(name)[i]["messages"]


def shared(a: list[Any], b: list[Any]) -> int:
    """How many leading messages two requests share."""
    n = 0
    while n < min(len(a), len(b)) and a[n] == b[n]:
        n += 1
    return n


def normalised(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    out, _ = normalise(messages, PROMPT_RULES)
    return messages if out is None else out


# --- Claude Code's billing header ------------------------------------------------------


def test_two_claude_code_conversations_share_their_system_prompt_once_the_header_is_gone() -> None:
    first = claude_messages("claude-code-conversation-1")
    second = claude_messages("claude-code-conversation-2")
    # As captured: the two conversations' billing codes differ, so the very first message does.
    assert first[0]["content"].startswith(BILLING) and first[0] != second[0]
    one, fired = normalise(first, PROMPT_RULES)
    two, _ = normalise(second, PROMPT_RULES)
    assert one is not None and two is not None
    assert fired == ("claude-code-billing-header",)
    assert one[0] == two[0] and BILLING not in one[0]["content"]
    # Only the line went: the system prompt is otherwise as it came.
    assert one[0]["content"] == first[0]["content"].split("\n", 1)[1]
    assert one[1:] == first[1:]
    # The conversations now differ only where their first user messages do.
    assert shared(one, two) == 1 and one[1]["content"] != two[1]["content"]


def test_claude_code_stays_append_only_inside_a_conversation() -> None:
    turn = [normalised(claude_messages("claude-code-conversation-1", i)) for i in (0, 1)]
    assert turn[1][: len(turn[0])] == turn[0]


def test_the_header_in_text_parts_and_a_system_message_of_nothing_else() -> None:
    messages = [
        {
            "role": "system",
            "content": [{"type": "text", "text": f"{BILLING} cc_version=1.2.3.abc;"}],
        },
        {
            "role": "system",
            "content": [
                {"type": "text", "text": f"{BILLING} cc_version=1.2.3.abc;\nYou are helpful."}
            ],
        },
        {"role": "user", "content": f"{BILLING} a user may say this"},
    ]
    out, fired = normalise(messages, ["claude-code-billing-header"])
    assert fired == ("claude-code-billing-header",)
    assert out == [
        {"role": "system", "content": [{"type": "text", "text": "You are helpful."}]},
        messages[2],  # only system messages are touched
    ]
    assert messages[0]["content"][0]["text"].startswith(BILLING)  # not changed in place


def test_a_system_prompt_without_the_header_is_left_alone() -> None:
    messages = [{"role": "system", "content": "Say x-anthropic-billing-header: later"}]
    assert normalise(messages, PROMPT_RULES) == (None, ())


# --- Qwen Code's date reminder -----------------------------------------------------------


def qwen_requests() -> list[list[dict[str, Any]]]:
    """Turn 1 (its request and the tool loop's next), then turn 2 (the same)."""
    return [
        qwen_messages(name, i) for name in ("qwen-code-turn-1", "qwen-code-turn-2") for i in (0, 1)
    ]


def test_qwen_code_turns_break_the_prefix_as_captured() -> None:
    t1, loop, t2, _ = qwen_requests()
    assert loop[: len(t1)] == t1  # inside a turn it appends
    # The next turn sends the first user message without its date reminder: only the system
    # prompt is still shared.
    assert shared(loop, t2) == 1


def test_qwen_code_turns_append_only_once_the_reminder_is_placed() -> None:
    requests = qwen_requests()
    out = [normalise(m, PROMPT_RULES) for m in requests]
    assert [fired for _, fired in out] == [("qwen-code-date-reminder",)] * 4
    placed = [m for m, _ in out]
    for before, after in itertools.pairwise(placed):
        assert after[: len(before)] == before
    for messages in placed:  # the model is still told the date, by the start-up context
        assert DATE in json.dumps(messages)
        assert "The current date is" not in json.dumps(messages)
    # Nothing but the reminder part went.
    t1 = requests[0]
    assert [p for p in t1[1]["content"] if "The current date is" not in p["text"]] == placed[0][1][
        "content"
    ]


def test_a_reminder_of_another_day_is_kept_after_the_users_text() -> None:
    # A session resumed the next day: the start-up context still names the first day.
    messages = copy.deepcopy(qwen_messages("qwen-code-turn-2", 0))
    last = messages[-1]["content"]
    reminder = next(p for p in last if "The current date is" in p["text"])
    reminder["text"] = reminder["text"].replace(DATE, "Wednesday, December 2, 2026")
    out, fired = normalise(messages, PROMPT_RULES)
    assert fired == ("qwen-code-date-reminder",) and out is not None
    assert out[-1]["content"][-1] == reminder  # moved to the end, whole
    assert [p["text"] for p in out[-1]["content"]] == ["And once more?", reminder["text"]]
    # the first user message's reminder named the first day: dropped there
    assert "The current date is" not in json.dumps(out[1])


def test_a_reminder_already_at_the_end_stays() -> None:
    reminder = {
        "type": "text",
        "text": "<system-reminder>\nThe current date is: Monday, May 4, 2026.\n</system-reminder>",
    }
    messages = [{"role": "user", "content": [{"type": "text", "text": "hi"}, reminder]}]
    assert normalise(messages, PROMPT_RULES) == (None, ())


def test_no_rules_no_change() -> None:
    assert normalise(claude_messages("claude-code-conversation-1"), ()) == (None, ())
    assert normalise(qwen_messages("qwen-code-turn-1", 0), ["claude-code-billing-header"]) == (
        None,
        (),
    )


# --- through the router ------------------------------------------------------------------


def policies(tmp_path: Path, **policy: str) -> str:
    folder = tmp_path / "policies"
    folder.mkdir(exist_ok=True)
    for name, text in policy.items():
        (folder / f"{name}.toml").write_text(text)
    return str(folder)


async def claude_code_request(url: str, fake: FakeUpstream) -> dict[str, Any]:
    """Claude Code's captured first request, sent with the official anthropic client; what
    the upstream got."""
    body = captured("claude-code-conversation-1")[0]
    async with anthropic.AsyncAnthropic(base_url=url, api_key="k", max_retries=0) as client:
        stream = await client.messages.create(
            model="fake-model",
            max_tokens=16,
            system=body["system"],
            messages=body["messages"],
            stream=True,
        )
        async for _ in stream:
            pass
    return fake.requests[-1].body


async def test_the_anthropic_door_drops_the_header_and_counts_it(tmp_path: Path) -> None:
    async with fake_upstream() as fake:
        async with run_router(router_settings(fake, policies_dir=policies(tmp_path))) as r:
            sent = await claude_code_request(r.url, fake)
            text = r.services.metrics.render().decode()
            record = r.services.access.recent[-1]
    assert sent["messages"][0]["content"].startswith("You are a Claude agent")
    labels = {"client": "default", "reason": "claude-code-billing-header"}
    assert metric_value(text, "speclane_prefix_breaks_total", **labels) == 1
    assert record.normalised == "claude-code-billing-header"
    assert "normalised=claude-code-billing-header" in record.line()


async def test_a_policy_without_rules_forwards_the_prompt_as_it_came(tmp_path: Path) -> None:
    folder = policies(tmp_path, default='client = "default"\nnormalise_prompts = []\n')
    async with fake_upstream() as fake:
        async with run_router(router_settings(fake, policies_dir=folder)) as r:
            sent = await claude_code_request(r.url, fake)
            text = r.services.metrics.render().decode()
            record = r.services.access.recent[-1]
    assert sent["messages"][0]["content"].startswith(BILLING)
    assert metric_value(text, "speclane_prefix_breaks_total") is None
    assert record.normalised is None


async def test_the_openai_door_places_qwen_codes_reminder(tmp_path: Path) -> None:
    body = captured("qwen-code-turn-2")[0]
    async with fake_upstream() as fake:
        async with run_router(router_settings(fake, policies_dir=policies(tmp_path))) as r:
            client = r.client()
            await client.chat.completions.create(
                model="fake-model", messages=body["messages"], max_tokens=8
            )
            text = r.services.metrics.render().decode()
    assert fake.requests[-1].body["messages"] == normalised(body["messages"])
    labels = {"client": "default", "reason": "qwen-code-date-reminder"}
    assert metric_value(text, "speclane_prefix_breaks_total", **labels) == 1


@pytest.mark.parametrize("value", [["no-such-rule"], "claude-code-billing-header"])
def test_the_policy_key_names_known_rules(tmp_path: Path, value: Any) -> None:
    from router.config.policies.schema import Policy

    if value == ["no-such-rule"]:
        with pytest.raises(ValueError, match="normalise_prompts"):
            Policy(client="x", normalise_prompts=value)
    else:
        assert Policy(client="x", normalise_prompts=value).normalise_prompts == (value,)
