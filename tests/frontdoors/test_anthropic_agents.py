"""What coding agents send the Anthropic door: system messages inside ``messages``,
``context_management`` edits, ``thinking``; and usage as Anthropic counts it."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from router.frontdoors import anthropic_context, anthropic_in
from router.frontdoors.anthropic_out import AnthropicEgress, message_body
from router.kernel.errors import RouterError
from tests.frontdoors.test_translators import anthropic_events, chunk, sse
from tests.fuzzing import examples

CLAUDE_CODE_EDITS = {"edits": [{"type": "clear_thinking_20251015", "keep": "all"}]}


def request(messages: list[dict[str, Any]], **fields: Any) -> dict[str, Any]:
    return {"model": "m", "max_tokens": 32000, "messages": messages, **fields}


def test_a_system_message_inside_messages_stays_in_its_place() -> None:
    # Claude Code's first request: the user's turn, then its environment as a system message.
    body = request(
        [
            {"role": "user", "content": [{"type": "text", "text": "say hi"}]},
            {
                "role": "system",
                "content": [
                    {"type": "text", "text": "# Environment"},
                    {"type": "text", "text": "cwd: /p"},
                ],
            },
        ],
        system=[{"type": "text", "text": "You are Claude Code."}],
        thinking={"type": "adaptive", "display": "omitted"},
        output_config={"effort": "medium"},
        context_management=CLAUDE_CODE_EDITS,
    )
    assert anthropic_in.to_openai(body).openai["messages"] == [
        {"role": "system", "content": "You are Claude Code."},
        {"role": "user", "content": "say hi"},
        {"role": "system", "content": "# Environment\ncwd: /p"},
    ]


def test_a_malformed_system_message_names_its_place() -> None:
    with pytest.raises(RouterError) as refused:
        anthropic_in.to_openai(
            request(
                [
                    {"role": "user", "content": "x"},
                    {"role": "system", "content": [{"type": "image"}]},
                ]
            )
        )
    assert refused.value.status == 400 and refused.value.param == "messages[1].content"


def test_input_tokens_exclude_the_cache_reads() -> None:
    usage = {
        "prompt_tokens": 3323,
        "completion_tokens": 7,
        "prompt_tokens_details": {"cached_tokens": 3304},
    }
    body = message_body(
        {"choices": [{"finish_reason": "stop", "message": {"content": "hi"}}], "usage": usage},
        "m",
        (),
    )
    assert body["usage"] == {
        "input_tokens": 19,
        "output_tokens": 7,
        "cache_read_input_tokens": 3304,
    }


def test_message_start_has_the_prompts_size_from_the_first_chunk() -> None:
    egress = AnthropicEgress("m")
    first = chunk(
        {"role": "assistant", "content": ""},
        usage={"prompt_tokens": 120, "completion_tokens": 0, "total_tokens": 120},
    )
    out = egress.events(
        sse(
            first,
            chunk({"content": "hi"}),
            chunk({}, "stop"),
            chunk(
                usage={
                    "prompt_tokens": 120,
                    "completion_tokens": 1,
                    "prompt_tokens_details": {"cached_tokens": 100},
                }
            ),
        )
    )
    events = anthropic_events(out + egress.finish())
    assert events[0][1]["message"]["usage"] == {"input_tokens": 120, "output_tokens": 0}
    assert events[-2][1]["usage"] == {
        "input_tokens": 20,
        "output_tokens": 1,
        "cache_read_input_tokens": 100,
    }


def tool_round(n: int, result: str = "x" * 400, name: str = "Read") -> list[dict[str, Any]]:
    return [
        {
            "role": "assistant",
            "content": [
                {"type": "tool_use", "id": f"t{n}", "name": name, "input": {"path": f"f{n}"}}
            ],
        },
        {
            "role": "user",
            "content": [{"type": "tool_result", "tool_use_id": f"t{n}", "content": result}],
        },
    ]


def conversation(rounds: int, **names: str) -> list[dict[str, Any]]:
    messages: list[dict[str, Any]] = [{"role": "user", "content": "go"}]
    for n in range(rounds):
        messages += tool_round(n, name=names.get(f"t{n}", "Read"))
    return messages


def results(openai: dict[str, Any]) -> list[str]:
    return [m["content"] for m in openai["messages"] if m["role"] == "tool"]


def test_clear_tool_uses_clears_the_oldest_results_past_the_trigger() -> None:
    edits = {
        "edits": [
            {
                "type": "clear_tool_uses_20250919",
                "trigger": {"type": "tool_uses", "value": 4},
                "keep": {"type": "tool_uses", "value": 2},
            }
        ]
    }
    body = request(conversation(5), context_management=edits)
    req = anthropic_in.to_openai(body)
    cleared = anthropic_context.CLEARED_RESULT
    assert results(req.openai) == [cleared, cleared, cleared, "x" * 400, "x" * 400]
    assert req.applied_edits == (
        {
            "type": "clear_tool_uses_20250919",
            "cleared_tool_uses": 3,
            "cleared_input_tokens": 3 * (100 - 9),
        },
    )
    assert body["messages"][2]["content"][0]["content"] == "x" * 400  # the client's copy
    answer = message_body(
        {"choices": [{"finish_reason": "stop", "message": {"content": "ok"}}]},
        "m",
        (),
        req.applied_edits,
    )
    assert answer["context_management"] == {"applied_edits": list(req.applied_edits)}


def test_clear_tool_uses_below_its_trigger_or_short_of_clear_at_least_changes_nothing() -> None:
    below = {"edits": [{"type": "clear_tool_uses_20250919"}]}  # 100,000 input tokens
    short = {
        "edits": [
            {
                "type": "clear_tool_uses_20250919",
                "keep": {"type": "tool_uses", "value": 0},
                "trigger": {"type": "input_tokens", "value": 10},
                "clear_at_least": {"type": "input_tokens", "value": 10_000},
            }
        ]
    }
    for edits in (below, short):
        req = anthropic_in.to_openai(request(conversation(5), context_management=edits))
        assert results(req.openai) == ["x" * 400] * 5
        assert req.applied_edits == ()


def test_clear_tool_uses_spares_excluded_tools_and_may_clear_inputs() -> None:
    edits = {
        "edits": [
            {
                "type": "clear_tool_uses_20250919",
                "keep": {"type": "tool_uses", "value": 0},
                "trigger": {"type": "tool_uses", "value": 1},
                "exclude_tools": ["Bash"],
                "clear_tool_inputs": True,
            }
        ]
    }
    req = anthropic_in.to_openai(request(conversation(2, t1="Bash"), context_management=edits))
    assert results(req.openai) == [anthropic_context.CLEARED_RESULT, "x" * 400]
    calls = [
        m["tool_calls"][0]["function"]["arguments"]
        for m in req.openai["messages"]
        if m.get("tool_calls")
    ]
    assert calls == ["{}", '{"path":"f1"}']


def test_clear_thinking_is_honoured_and_reported() -> None:
    thinking = {
        "role": "assistant",
        "content": [
            {"type": "thinking", "thinking": "hm", "signature": "s"},
            {"type": "text", "text": "ok"},
        ],
    }
    messages = [
        {"role": "user", "content": "a"},
        thinking,
        {"role": "user", "content": "b"},
        thinking,
        {"role": "user", "content": "c"},
    ]
    keep_one = {
        "edits": [
            {"type": "clear_thinking_20251015", "keep": {"type": "thinking_turns", "value": 1}}
        ]
    }
    req = anthropic_in.to_openai(request(messages, context_management=keep_one))
    assert req.applied_edits == (
        {"type": "clear_thinking_20251015", "cleared_thinking_turns": 1, "cleared_input_tokens": 0},
    )
    keep_all = anthropic_in.to_openai(request(messages, context_management=CLAUDE_CODE_EDITS))
    assert keep_all.applied_edits == ()
    assert anthropic_in.to_openai(request(messages)).applied_edits is None


@pytest.mark.parametrize(
    "edits, param",
    [
        ({"edits": [{"type": "compact_20260112"}]}, "context_management.edits[0]"),
        (
            {"edits": [{"type": "clear_tool_uses_20250919", "keep": 3}]},
            "context_management.edits[0].keep",
        ),
        ({"edits": "all"}, "context_management"),
    ],
)
def test_an_edit_speclane_cannot_apply_is_refused_by_name(edits: Any, param: str) -> None:
    with pytest.raises(RouterError) as refused:
        anthropic_in.to_openai(request(conversation(1), context_management=edits))
    assert refused.value.status == 400 and refused.value.param == param


THRESHOLD = (
    st.none()
    | st.integers(-1, 3)
    | st.fixed_dictionaries(
        {
            "type": st.sampled_from(["input_tokens", "tool_uses", "thinking_turns", "x"]),
            "value": st.integers(-1, 200) | st.booleans() | st.none(),
        }
    )
)
EDIT = st.fixed_dictionaries(
    {"type": st.sampled_from(["clear_tool_uses_20250919", "clear_thinking_20251015", "other"])},
    optional={
        "trigger": THRESHOLD,
        "keep": THRESHOLD | st.just("all"),
        "clear_at_least": THRESHOLD,
        "exclude_tools": st.none() | st.lists(st.sampled_from(["Read", "Bash", 3]), max_size=2),
        "clear_tool_inputs": st.booleans() | st.lists(st.sampled_from(["Read", 1]), max_size=2),
    },
)


@settings(max_examples=examples(200), deadline=None)
@given(st.lists(EDIT, max_size=3), st.integers(0, 6))
def test_any_edit_list_is_applied_or_refused(edits: list[dict[str, Any]], rounds: int) -> None:
    body = request(conversation(rounds), context_management={"edits": edits})
    try:
        req = anthropic_in.to_openai(body)
    except RouterError as e:
        assert e.status == 400 and str(e.param).startswith("context_management")
        return
    assert req.applied_edits is not None
    assert len(results(req.openai)) == rounds  # results are cleared, never dropped
