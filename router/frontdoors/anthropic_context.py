"""Anthropic context editing (``context_management.edits``) applied to a request (pure).

Claude Code sends ``context_management`` with every request. Two kinds are applied as
Anthropic documents them, oldest first, before translation; any other kind is a 400, never
ignored:

- ``clear_tool_uses_20250919``: once the prompt passes ``trigger`` (``input_tokens``,
  default 100,000, or ``tool_uses``), the oldest tool results are replaced by
  ``CLEARED_RESULT`` until only ``keep`` tool uses (default 3) remain whole, skipping
  ``exclude_tools``; ``clear_tool_inputs`` (true, or a list of tool names) also empties the
  calls' inputs; ``clear_at_least`` (``input_tokens``): when the clearable results cannot
  free that much, nothing is cleared. Input tokens are estimated here, before the lane's
  tokenizer runs, at ``CHARS_PER_TOKEN`` characters a token.
- ``clear_thinking_20251015``: thinking blocks never reach the lanes (``anthropic_in``
  drops them), so every ``keep`` is already honoured; the cleared turns are reported, with
  no input tokens saved.

What was applied is reported back as ``context_management.applied_edits``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import orjson

from router.errors import bad_request

CLEAR_TOOL_USES = "clear_tool_uses_20250919"
CLEAR_THINKING = "clear_thinking_20251015"
CLEARED_RESULT = "[tool result cleared to save context]"
CHARS_PER_TOKEN = 4
DEFAULT_TRIGGER_TOKENS = 100_000
DEFAULT_KEEP_TOOL_USES = 3
PARAM = "context_management"


@dataclass(frozen=True, slots=True)
class Edited:
    messages: list[Any]
    applied: tuple[dict[str, Any], ...]
    requested: bool  # the request carried context_management: the answer reports it


def apply(body: dict[str, Any], messages: list[Any]) -> Edited:
    config = body.get(PARAM)
    if config is None:
        return Edited(messages, (), False)
    if not isinstance(config, dict) or not isinstance(config.get("edits", []), list):
        raise bad_request(
            "'context_management' must be an object with an 'edits' array", param=PARAM
        )
    applied = []
    for i, edit in enumerate(config.get("edits", [])):
        at = f"{PARAM}.edits[{i}]"
        kind = edit.get("type") if isinstance(edit, dict) else None
        if kind == CLEAR_TOOL_USES:
            messages, done = _clear_tool_uses(body, messages, edit, at)
        elif kind == CLEAR_THINKING:
            done = _clear_thinking(messages, edit, at)
        else:
            raise bad_request(
                f"'{at}.type' {kind!r} is not supported (speclane applies "
                f"{CLEAR_TOOL_USES} and {CLEAR_THINKING})",
                param=at,
            )
        if done is not None:
            applied.append(done)
    return Edited(messages, tuple(applied), True)


def _threshold(
    value: Any, kinds: tuple[str, ...], default: tuple[str, int] | None, at: str
) -> tuple[str, int] | None:
    if value is None:
        return default
    if (
        isinstance(value, dict)
        and value.get("type") in kinds
        and isinstance(value.get("value"), int)
        and not isinstance(value["value"], bool)
        and value["value"] >= 0
    ):
        return str(value["type"]), int(value["value"])
    raise bad_request(
        f'\'{at}\' must be {{"type": {" or ".join(kinds)}, "value": a non-negative integer}}',
        param=at,
    )


def estimate_tokens(value: Any) -> int:
    return len(orjson.dumps(value)) // CHARS_PER_TOKEN


def _tool_uses(messages: list[Any]) -> list[tuple[int, int, str, str]]:
    """(message index, block index, id, name) of each tool_use, oldest first."""
    found = []
    for i, m in enumerate(messages):
        if (
            isinstance(m, dict)
            and m.get("role") == "assistant"
            and isinstance(m.get("content"), list)
        ):
            for j, block in enumerate(m["content"]):
                if isinstance(block, dict) and block.get("type") == "tool_use":
                    found.append((i, j, str(block.get("id")), str(block.get("name"))))
    return found


def _results(messages: list[Any]) -> dict[str, tuple[int, int]]:
    """tool_use_id -> (message index, block index) of its tool_result."""
    found = {}
    for i, m in enumerate(messages):
        if isinstance(m, dict) and m.get("role") == "user" and isinstance(m.get("content"), list):
            for j, block in enumerate(m["content"]):
                if isinstance(block, dict) and block.get("type") == "tool_result":
                    found[str(block.get("tool_use_id"))] = (i, j)
    return found


def _clear_tool_uses(
    body: dict[str, Any], messages: list[Any], edit: dict[str, Any], at: str
) -> tuple[list[Any], dict[str, Any] | None]:
    trigger = _threshold(
        edit.get("trigger"),
        ("input_tokens", "tool_uses"),
        ("input_tokens", DEFAULT_TRIGGER_TOKENS),
        f"{at}.trigger",
    )
    keep = _threshold(
        edit.get("keep"), ("tool_uses",), ("tool_uses", DEFAULT_KEEP_TOOL_USES), f"{at}.keep"
    )
    at_least = _threshold(
        edit.get("clear_at_least"), ("input_tokens",), None, f"{at}.clear_at_least"
    )
    excluded = _names(edit.get("exclude_tools"), f"{at}.exclude_tools")
    inputs = edit.get("clear_tool_inputs", False)
    if not isinstance(inputs, bool):
        inputs = set(_names(inputs, f"{at}.clear_tool_inputs"))
    assert trigger is not None and keep is not None
    uses = _tool_uses(messages)
    size = estimate_tokens([body.get("system"), messages, body.get("tools")])
    if (size if trigger[0] == "input_tokens" else len(uses)) < trigger[1]:
        return messages, None
    results = _results(messages)
    clearable = [u for u in uses[: max(0, len(uses) - keep[1])] if u[3] not in excluded]
    edited = [dict(m) if isinstance(m, dict) else m for m in messages]
    copied: set[int] = set()
    cleared, saved = 0, 0
    for i, j, call_id, name in clearable:
        where = results.get(call_id)
        if where is None:
            continue
        block = _block(edited, copied, *where)
        if block.get("content") == CLEARED_RESULT:
            continue
        saved += estimate_tokens(block.get("content", "")) - estimate_tokens(CLEARED_RESULT)
        block["content"] = CLEARED_RESULT
        if inputs is True or (isinstance(inputs, set) and name in inputs):
            use = _block(edited, copied, i, j)
            saved += estimate_tokens(use.get("input", {})) - estimate_tokens({})
            use["input"] = {}
        cleared += 1
    if not cleared or (at_least is not None and saved < at_least[1]):
        return messages, None  # Anthropic: an edit that cannot clear enough is not applied
    return edited, {
        "type": CLEAR_TOOL_USES,
        "cleared_tool_uses": cleared,
        "cleared_input_tokens": max(0, saved),
    }


def _block(edited: list[Any], copied: set[int], i: int, j: int) -> dict[str, Any]:
    """Block j of message i, copied before it is changed (the client's body stays as sent)."""
    if i not in copied:
        edited[i]["content"] = [dict(b) if isinstance(b, dict) else b for b in edited[i]["content"]]
        copied.add(i)
    block: dict[str, Any] = edited[i]["content"][j]
    return block


def _clear_thinking(messages: list[Any], edit: dict[str, Any], at: str) -> dict[str, Any] | None:
    keep = edit.get("keep")
    turns = sum(
        1
        for m in messages
        if isinstance(m, dict)
        and m.get("role") == "assistant"
        and isinstance(m.get("content"), list)
        and any(
            isinstance(b, dict) and b.get("type") in ("thinking", "redacted_thinking")
            for b in m["content"]
        )
    )
    if keep == "all":
        return None
    threshold = _threshold(keep, ("thinking_turns",), ("thinking_turns", 1), f"{at}.keep")
    assert threshold is not None
    cleared = max(0, turns - threshold[1])
    if not cleared:
        return None
    return {"type": CLEAR_THINKING, "cleared_thinking_turns": cleared, "cleared_input_tokens": 0}


def _names(value: Any, at: str) -> tuple[str, ...]:
    if value is None:
        return ()
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise bad_request(f"'{at}' must be an array of tool names", param=at)
    return tuple(value)
