"""``speclane bench prefill``'s request bodies: trimmed alike, the volatile lines kept, the
derived shapes built from the captured ones."""

from __future__ import annotations

import json

from router.bench.prefill import shapes


def test_head_cuts_at_a_line_and_keeps_every_volatile_line() -> None:
    text = "one\ntwo\nthree\nToday's date is 2026-12-01.\nfour\n"
    assert shapes.head(text, 9) == "one\ntwo\nToday's date is 2026-12-01.\n"
    assert shapes.head(text, 1000) == text


def test_trim_keeps_the_billing_line_the_date_and_the_named_tools() -> None:
    first = shapes.load("claude-code-conversation-1")[0]
    trimmed = shapes.trim(first)
    assert trimmed["system"][0] == first["system"][0]  # the billing line, whole
    assert len(trimmed["system"][2]["text"]) <= shapes.SYSTEM_CHARS
    assert [t["name"] for t in trimmed["tools"]] == ["Edit", "Read", "Write"]
    environment = next(m for m in trimmed["messages"] if m["role"] == "system")
    assert "Today's date is 2026-12-01." in environment["content"][0]["text"]
    assert len(json.dumps(trimmed)) < len(json.dumps(first)) / 4
    assert "metadata" not in trimmed


def test_two_requests_that_shared_a_prefix_still_share_it() -> None:
    one, two = (shapes.trim(b) for b in shapes.load("qwen-code-turn-1"))
    assert two["messages"][: len(one["messages"])] == one["messages"]
    assert one["tools"] == two["tools"] and [t["function"]["name"] for t in one["tools"]] == [
        "glob",
        "read_file",
    ]


def test_a_compaction_changes_the_first_message_and_the_billing_code() -> None:
    first = shapes.load("claude-code-conversation-1")[0]
    compacted = shapes.compaction(first)
    assert compacted["system"][1:] == first["system"][1:]
    assert compacted["tools"] == first["tools"]
    assert compacted["system"][0] != first["system"][0]
    assert "cc_version=2.1.332.c0d;" in compacted["system"][0]["text"]
    assert compacted["messages"][0]["content"][-1]["text"] == shapes.SUMMARY
    assert compacted["messages"][1:] == first["messages"][1:]


def test_a_subagent_has_its_own_prompt_and_the_parents_tools_but_agent() -> None:
    first = shapes.load("claude-code-conversation-1")[0]
    sub = shapes.subagent(first, "Find it.", "abc")
    assert "cc_version=2.1.332.abc;" in sub["system"][0]["text"]
    assert sub["system"][1] == first["system"][1]
    assert sub["system"][2]["text"].startswith(shapes.SUBAGENT_PROMPT)
    assert [t["name"] for t in sub["tools"]] == [t["name"] for t in first["tools"][1:]]
    assert sub["messages"] == [{"role": "user", "content": [{"type": "text", "text": "Find it."}]}]


def test_codex_resends_its_whole_input_each_turn() -> None:
    first, loop, second = (shapes.trim(b) for b in shapes.codex_turns())
    assert loop["input"][: len(first["input"])] == first["input"]
    assert second["input"][: len(loop["input"])] == loop["input"]
    assert [i.get("type") for i in loop["input"][-2:]] == ["function_call", "function_call_output"]
    assert [t["name"] for t in first["tools"]] == ["exec_command"]
    assert len(first["input"][0]["content"][0]["text"]) <= shapes.SYSTEM_CHARS
    assert "client_metadata" not in first


def test_with_max_tokens_drops_the_programs_output_settings() -> None:
    body = shapes.with_max_tokens(shapes.load("claude-code-conversation-1")[0], 8)
    assert body["max_tokens"] == 8 and body["temperature"] == 0 and body["stream"] is True
    assert "thinking" not in body and "output_config" not in body
    assert shapes.with_max_tokens(shapes.codex_turns()[0], 8)["max_output_tokens"] == 8
