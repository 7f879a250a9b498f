"""The one folding rule for late system messages (``router.system_messages``), on JSON
messages as the proxy forwards them."""

from __future__ import annotations

import itertools
from typing import Any

import pytest

from router.system_messages import fold_json, needs_fold

Messages = list[dict[str, Any]]


def chatml(messages: Messages, *, generation_prompt: bool = True) -> str:
    """A Qwen-style rendering (ChatML) with the Qwen templates' guard: a system message
    anywhere but first raises, as "System message must be at the beginning." does."""
    out = []
    for i, m in enumerate(messages):
        if m["role"] in ("system", "developer") and i > 0:
            raise ValueError("System message must be at the beginning.")
        content = m["content"]
        if isinstance(content, list):
            content = "".join(p["text"] for p in content if p.get("type") == "text")
        out.append(f"<|im_start|>{m['role']}\n{content or ''}<|im_end|>\n")
    return "".join(out) + ("<|im_start|>assistant\n" if generation_prompt else "")


def claude_code_turns() -> list[Messages]:
    """Four turns of a conversation as an agent sends it: each turn appends the model's
    answer, then new messages, with a fresh late system message on most turns."""
    turn1: Messages = [
        {"role": "system", "content": "You are an agent."},
        {"role": "user", "content": "fix the bug"},
        {"role": "system", "content": "cwd: /repo"},
    ]
    turn2 = [
        *turn1,
        {"role": "assistant", "content": "Which file?"},
        {"role": "system", "content": "reminder: be brief"},
        {"role": "user", "content": "main.py"},
        {"role": "developer", "content": "todo list: empty"},
    ]
    call = {"id": "c1", "type": "function", "function": {"name": "read", "arguments": "{}"}}
    turn3 = [
        *turn2,
        {"role": "assistant", "content": None, "tool_calls": [call]},
        {"role": "tool", "tool_call_id": "c1", "content": "print(1)"},
        {"role": "system", "content": "file changed on disk"},
    ]
    turn4 = [
        *turn3,
        {"role": "assistant", "content": "Done."},
        {"role": "user", "content": [{"type": "text", "text": "thanks"}]},
        {"role": "system", "content": "usage: 40%"},
    ]
    return [turn1, turn2, turn3, turn4]


def test_every_turn_renders_under_the_guard_and_extends_the_turn_before() -> None:
    turns = claude_code_turns()
    for turn in turns:
        assert needs_fold(turn)
    # Turn N's prompt (what the backend's prompt cache holds, up to the model's answer) is
    # a prefix of turn N+1's, though turn N+1 brings a new late system message.
    for before, after in itertools.pairwise(turns):
        head = chatml(fold_json(before), generation_prompt=False)
        assert chatml(fold_json(after)).startswith(head)
    # Unfolded, the template refuses every one of them.
    for turn in turns:
        with pytest.raises(ValueError, match="must be at the beginning"):
            chatml(turn)


def test_folding_is_deterministic_and_does_not_touch_its_input() -> None:
    turn = claude_code_turns()[3]
    copy = [dict(m) for m in turn]
    assert fold_json(turn) == fold_json(turn)
    assert turn == copy


def test_the_shapes() -> None:
    folded = fold_json(claude_code_turns()[3])
    assert [m["role"] for m in folded] == [
        "system",
        "user",
        "assistant",
        "user",
        "assistant",
        "tool",
        "user",
        "assistant",
        "user",
    ]
    assert folded[1]["content"] == "fix the bug\n\n<system>\ncwd: /repo\n</system>"
    assert folded[3]["content"] == (
        "<system>\nreminder: be brief\n</system>\n\nmain.py"
        "\n\n<system>\ntodo list: empty\n</system>"
    )
    assert folded[6]["content"] == "<system>\nfile changed on disk\n</system>"
    # parts stay parts; the note is one more text part
    assert folded[8]["content"] == [
        {"type": "text", "text": "thanks"},
        {"type": "text", "text": "\n\n<system>\nusage: 40%\n</system>"},
    ]
    assert folded[4]["tool_calls"][0]["id"] == "c1"  # other fields kept


def test_a_leading_developer_or_several_leading_systems_become_one_system() -> None:
    messages: Messages = [
        {"role": "developer", "content": "a"},
        {"role": "system", "content": [{"type": "text", "text": "b"}]},
        {"role": "user", "content": "hi"},
    ]
    assert needs_fold(messages)
    assert fold_json(messages) == [
        {"role": "system", "content": "a\n\nb"},
        {"role": "user", "content": "hi"},
    ]


def test_nothing_to_fold() -> None:
    plain: Messages = [{"role": "system", "content": "S"}, {"role": "user", "content": "hi"}]
    assert not needs_fold(plain) and not needs_fold([])
    assert fold_json(plain) == plain
