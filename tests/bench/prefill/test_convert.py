"""What ``mlx_lm.server`` is sent: a program's body as the lane's worker would hand it to the
chat template (the default SmolLM2 template renders no tools: they go in the system text)."""

from __future__ import annotations

from typing import Any

from router.bench.prefill import convert, shapes
from router.worker.decoding.tools import FALLBACK_INTRO


class NoToolsTokenizer:
    """A tokenizer whose template has no tool calling (as the default model's)."""

    has_tool_calling = False


def test_an_anthropic_body_becomes_the_workers_messages() -> None:
    body = shapes.trim(shapes.load("claude-code-conversation-1")[1])
    chat = convert.for_mlx_lm("anthropic", {**body, "max_tokens": 8}, NoToolsTokenizer(), "m")
    messages: list[dict[str, Any]] = chat["messages"]
    assert "tools" not in chat and chat["model"] == "m" and chat["max_tokens"] == 8
    assert messages[0]["role"] == "system"
    assert messages[0]["content"].startswith("x-anthropic-billing-header:")  # not normalised
    assert FALLBACK_INTRO in messages[0]["content"] and '"name": "Read"' in messages[0]["content"]
    assert all(m["role"] in ("system", "user", "assistant") for m in messages)
    assert any("<tool_response>" in m["content"] for m in messages)  # the Read result
    assert sum(m["role"] == "system" for m in messages) == 1  # the later one folded


def test_a_responses_body_becomes_the_workers_messages() -> None:
    body = shapes.with_max_tokens(shapes.trim(shapes.codex_turns()[1]), 8)
    chat = convert.for_mlx_lm("responses", body, NoToolsTokenizer(), "m")
    text = "\n".join(m["content"] for m in chat["messages"])
    assert chat["max_tokens"] == 8 and text.startswith("You are a coding agent")
    assert '"name": "exec_command"' in text and "SECRET-LINE" in text
