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
from functools import cached_property
from typing import Any

import orjson

from router.kernel.errors import bad_request

CLEAR_TOOL_USES = "clear_tool_uses_20250919"
CLEAR_THINKING = "clear_thinking_20251015"
CLEARED_RESULT = "[tool result cleared to save context]"
CHARS_PER_TOKEN = 4
DEFAULT_TRIGGER_TOKENS = 100_000
DEFAULT_KEEP_TOOL_USES = 3
PARAM = "context_management"
# Edits one request may carry: Claude Code sends one of each kind. Each edit costs a pass over
# the conversation's tool uses, so an unbounded list would cost its length times the
# history (an 8 MiB body held the event loop for an hour before this bound).
MAX_EDITS = 16


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
    edits = config.get("edits", [])
    if len(edits) > MAX_EDITS:
        raise bad_request(
            f"'{PARAM}.edits' holds {len(edits)} edits; at most {MAX_EDITS} are accepted",
            param=f"{PARAM}.edits",
        )
    history = _History(body, messages)
    applied = []
    for i, edit in enumerate(edits):
        at = f"{PARAM}.edits[{i}]"
        kind = edit.get("type") if isinstance(edit, dict) else None
        if kind == CLEAR_TOOL_USES:
            done = _clear_tool_uses(history, edit, at)
        elif kind == CLEAR_THINKING:
            done = _clear_thinking(history, edit, at)
        else:
            raise bad_request(
                f"'{at}.type' {kind!r} is not supported (speclane applies "
                f"{CLEAR_TOOL_USES} and {CLEAR_THINKING})",
                param=at,
            )
        if done is not None:
            applied.append(done)
    return Edited(history.messages, tuple(applied), True)


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
    return _chars(value) // CHARS_PER_TOKEN


def _chars(value: Any) -> int:
    return len(orjson.dumps(value))


class _History:
    """The conversation the edits work on, read once: an edit then costs a pass over the
    tool uses and what it changes, never a new encoding of the whole history.

    ``messages`` is the client's list until an edit changes it, then a copy whose changed
    messages and blocks are copies too (the client's body stays as sent). ``chars`` is the
    length of ``[system, messages, tools]`` encoded, kept exact as blocks change (what the
    ``input_tokens`` trigger reads).
    """

    def __init__(self, body: dict[str, Any], messages: list[Any]) -> None:
        self.messages = messages
        self._body = body
        self._copied: set[int] | None = None  # messages whose blocks are copies
        self._sizes: dict[tuple[int, int, str], int] = {}  # a field's encoded length
        self._thinking_turns: int | None = None

    # Read when an edit first needs them (Claude Code's usual clear_thinking needs none).
    @cached_property
    def uses(self) -> list[tuple[int, int, str, str]]:
        return _tool_uses(self.messages)

    @cached_property
    def results(self) -> dict[str, tuple[int, int]]:
        return _results(self.messages)

    @cached_property
    def chars(self) -> int:
        body = self._body
        return _chars([body.get("system"), self.messages, body.get("tools")])

    def thinking_turns(self) -> int:
        if self._thinking_turns is None:  # the edits never change thinking blocks
            self._thinking_turns = sum(
                1
                for m in self.messages
                if isinstance(m, dict)
                and m.get("role") == "assistant"
                and isinstance(m.get("content"), list)
                and any(
                    isinstance(b, dict) and b.get("type") in ("thinking", "redacted_thinking")
                    for b in m["content"]
                )
            )
        return self._thinking_turns

    def block(self, i: int, j: int) -> dict[str, Any]:
        found: dict[str, Any] = self.messages[i]["content"][j]
        return found

    def tokens(self, i: int, j: int, key: str, default: Any) -> int:
        """The estimated tokens of block j's ``key`` (each field is encoded once at most)."""
        return self._size(i, j, key, default) // CHARS_PER_TOKEN

    def replace(self, i: int, j: int, key: str, value: Any) -> None:
        """Block j of message i gets ``key: value``, in a copy of the block."""
        total = self.chars  # measured before anything changes
        if self._copied is None:
            self.messages = [dict(m) if isinstance(m, dict) else m for m in self.messages]
            self._copied = set()
        if i not in self._copied:
            content = self.messages[i]["content"]
            self.messages[i]["content"] = [dict(b) if isinstance(b, dict) else b for b in content]
            self._copied.add(i)
        block = self.block(i, j)
        # The encoding changes by the value's length; a key the block lacked adds ,"key":
        old = self._size(i, j, key, None) if key in block else -(len(key) + 4)
        block[key] = value
        self._sizes[(i, j, key)] = new = _chars(value)
        self.chars = total + new - old

    def _size(self, i: int, j: int, key: str, default: Any) -> int:
        found = self._sizes.get((i, j, key))
        if found is None:
            found = self._sizes[(i, j, key)] = _chars(self.block(i, j).get(key, default))
        return found


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


def _clear_tool_uses(history: _History, edit: dict[str, Any], at: str) -> dict[str, Any] | None:
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
    uses = history.uses
    size = history.chars // CHARS_PER_TOKEN
    if (size if trigger[0] == "input_tokens" else len(uses)) < trigger[1]:
        return None
    cleared_tokens = estimate_tokens(CLEARED_RESULT)
    # What the edit would clear, and the tokens that saves, before anything changes: an
    # edit that cannot clear enough is not applied (Anthropic), and leaves nothing behind.
    plan: list[tuple[tuple[int, int], tuple[int, int] | None]] = []  # result, use's input
    saved = 0
    for i, j, call_id, name in uses[: max(0, len(uses) - keep[1])]:
        where = history.results.get(call_id)
        if name in excluded or where is None:
            continue
        if history.block(*where).get("content") == CLEARED_RESULT:
            continue
        saved += history.tokens(*where, "content", "") - cleared_tokens
        use = None
        if inputs is True or (isinstance(inputs, set) and name in inputs):
            saved += history.tokens(i, j, "input", {}) - estimate_tokens({})
            use = (i, j)
        plan.append((where, use))
    if not plan or (at_least is not None and saved < at_least[1]):
        return None
    for result, use in plan:
        history.replace(*result, "content", CLEARED_RESULT)
        if use is not None:
            history.replace(*use, "input", {})
    return {
        "type": CLEAR_TOOL_USES,
        "cleared_tool_uses": len(plan),
        "cleared_input_tokens": max(0, saved),
    }


def _clear_thinking(history: _History, edit: dict[str, Any], at: str) -> dict[str, Any] | None:
    keep = edit.get("keep")
    if keep == "all":
        return None
    threshold = _threshold(keep, ("thinking_turns",), ("thinking_turns", 1), f"{at}.keep")
    assert threshold is not None
    cleared = max(0, history.thinking_turns() - threshold[1])
    if not cleared:
        return None
    return {"type": CLEAR_THINKING, "cleared_thinking_turns": cleared, "cleared_input_tokens": 0}


def _names(value: Any, at: str) -> tuple[str, ...]:
    if value is None:
        return ()
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise bad_request(f"'{at}' must be an array of tool names", param=at)
    return tuple(value)
