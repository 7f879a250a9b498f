"""Hostile input to the translators: any JSON from a client is a translation or a 400, any
OpenAI-ish event from an upstream is translated or skipped; nothing else escapes."""

from __future__ import annotations

import orjson
from hypothesis import given, settings
from hypothesis import strategies as st

from router.frontdoors import anthropic_in, ollama_in
from router.frontdoors.anthropic_out import AnthropicEgress
from router.frontdoors.ollama_out import OllamaEgress
from router.kernel.errors import RouterError
from tests.fuzzing import examples

KEYS = st.sampled_from(
    [
        "model",
        "max_tokens",
        "messages",
        "role",
        "content",
        "type",
        "text",
        "tool_use_id",
        "id",
        "name",
        "input",
        "tools",
        "tool_choice",
        "system",
        "stop_sequences",
        "options",
        "format",
        "tool_calls",
        "function",
        "arguments",
        "images",
        "index",
        "delta",
        "choices",
        "finish_reason",
        "usage",
        "error",
        "stream",
        "source",
        "prompt",
        "raw",
        "num_predict",
        "context_management",
        "edits",
        "trigger",
        "keep",
        "value",
        "clear_at_least",
        "exclude_tools",
        "clear_tool_inputs",
    ]
)
JSON = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-5, 10**6)
    | st.floats(allow_nan=False)
    | st.sampled_from(
        [
            "user",
            "assistant",
            "tool",
            "text",
            "tool_use",
            "tool_result",
            "image",
            "m",
            "json",
            "",
            "stop",
            "length",
            "tool_calls",
            "system",
            "clear_tool_uses_20250919",
            "clear_thinking_20251015",
            "tool_uses",
            "input_tokens",
            "thinking_turns",
            "all",
        ]
    ),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(KEYS, inner, max_size=6),
    max_leaves=30,
)


@settings(max_examples=examples(300), deadline=None)
@given(JSON)
def test_any_request_is_translated_or_refused(body: object) -> None:
    for translate in (
        anthropic_in.to_openai,
        ollama_in.chat_to_openai,
        ollama_in.generate_to_openai,
    ):
        try:
            translate(body if isinstance(body, dict) else {"messages": body})  # type: ignore[operator]
        except RouterError as e:
            assert e.status == 400


@settings(max_examples=examples(300), deadline=None)
@given(st.lists(JSON, max_size=5))
def test_any_upstream_event_is_translated_or_skipped(events: list[object]) -> None:
    data = b"".join(b"data: " + orjson.dumps(e) + b"\n\n" for e in events)
    for egress in (AnthropicEgress("m"), OllamaEgress("chat", "m", 0.0)):
        out = egress.events(data) + egress.finish()  # type: ignore[attr-defined]
        assert isinstance(out, bytes)
        for event in events:
            try:
                egress.body(event)  # type: ignore[attr-defined]
            except RouterError as e:
                assert e.status == 502
