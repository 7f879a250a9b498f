"""Prompt normalisation: the agents' volatile lines, rendered so that they do not break the
prompt's prefix (pure).

A lane reuses a prompt's KV cache only up to the first token that differs from what it saw
before. Some agent programs put a line that changes between conversations or turns near the
start of their prompt, and every request after it prefills everything again. Each rule
below is named (``router.config.names.PROMPT_RULES``), applied to a chat request's OpenAI
messages after its front door translated it, and listed per policy
(``normalise_prompts``, every rule by default; ``[]`` switches them off):

- ``claude-code-billing-header``: Claude Code starts its system prompt with
  ``x-anthropic-billing-header: cc_version=<version>.<3 hex>; cc_entrypoint=...;``, whose
  hex digits follow the conversation's first message: every new session, compaction and
  sub-agent diverged at token ~25. The line is Anthropic's accounting and tells a local
  model nothing: it is dropped (from every system message that starts with it).
- ``qwen-code-date-reminder``: Qwen Code puts ``<system-reminder>\\nThe current date is:
  <date>. Note: ...</system-reminder>`` as a text part before the newest user message's text,
  and sends that message without it on the next turn: every turn re-prefilled everything
  after the previous user message. When the same date already stands earlier in the
  request (Qwen Code's start-up context says ``Today's date is <date>.``), the part tells
  the model nothing new and is dropped; when it does not (a conversation that crossed
  midnight, a session resumed another day), it is kept and moved to the end of its message,
  after the user's text, so that at least that text stays a shared prefix next turn.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from typing import Any

from router.config.names import PromptRule
from router.kernel.system_messages import SYSTEM_ROLES

BILLING_LINE = re.compile(r"x-anthropic-billing-header:[^\n]*(?:\n|\Z)")
# The date in group 1; the note after it has varied between versions, so it is not matched.
DATE_REMINDER = re.compile(
    r"\s*<system-reminder>\s*The current date is:\s*([^\n]+?)\.(?:[ \t][^\n]*)?\s*"
    r"</system-reminder>\s*"
)
REMINDER_START = "<system-reminder>"


def normalise(
    messages: list[Any], rules: Iterable[PromptRule]
) -> tuple[list[Any] | None, tuple[PromptRule, ...]]:
    """(the messages with the ``rules`` applied, or None when none changed anything; the
    rules that fired). ``messages`` were validated as chat messages (objects with a role)
    and are not changed in place."""
    fired: list[PromptRule] = []
    out = messages
    for rule in rules:
        changed = RULES[rule](out)
        if changed is not None:
            out = changed
            fired.append(rule)
    return (out if fired else None), tuple(fired)


def drop_billing_header(messages: list[Any]) -> list[Any] | None:
    out: list[Any] | None = None
    for i, message in enumerate(messages):
        if message.get("role") not in SYSTEM_ROLES:
            continue
        content = message.get("content")
        new: Any
        if isinstance(content, str):
            new = _without_billing(content)
        elif isinstance(content, list):
            parts = [_part_without_billing(p) for p in content]
            new = None
            if any(p is not q for p, q in zip(parts, content, strict=True)):
                new = [p for p in parts if p is not DROPPED]
        else:
            continue
        if new is None:
            continue
        if out is None:
            out = list(messages)
        out[i] = {**message, "content": new}
    if out is None:
        return None
    # A system message that held nothing but the line is gone with it.
    return [m for m in out if m.get("role") not in SYSTEM_ROLES or m.get("content") not in ("", [])]


DROPPED: dict[str, Any] = {}  # a part left empty: removed from its message


def _without_billing(text: str) -> str | None:
    match = BILLING_LINE.match(text)
    return None if match is None else text[match.end() :]


def _part_without_billing(part: Any) -> Any:
    if not isinstance(part, dict) or part.get("type") != "text":
        return part
    text = part.get("text")
    rest = _without_billing(text) if isinstance(text, str) else None
    if rest is None:
        return part
    return {**part, "text": rest} if rest else DROPPED


def place_date_reminder(messages: list[Any]) -> list[Any] | None:
    out: list[Any] | None = None
    for i, message in enumerate(messages):
        content = message.get("content")
        if message.get("role") != "user" or not isinstance(content, list):
            continue
        for j, part in enumerate(content):
            date = _reminder_date(part)
            if date is None:
                continue
            rest = content[:j] + content[j + 1 :]
            if _stands_before(date, messages[:i], content[:j]):
                new = rest  # the same fact is already in the prompt
            elif j == len(content) - 1:
                break  # already at the end: nothing to move
            else:
                new = [*rest, part]
            if out is None:
                out = list(messages)
            out[i] = {**message, "content": new}
            break  # one reminder per message
    return out


def _reminder_date(part: Any) -> str | None:
    if not isinstance(part, dict) or part.get("type") != "text":
        return None
    text = part.get("text")
    if not isinstance(text, str) or REMINDER_START not in text[:64]:
        return None
    match = DATE_REMINDER.fullmatch(text)
    return match.group(1).strip() if match is not None else None


def _stands_before(date: str, messages: list[Any], parts: list[Any]) -> bool:
    """Does ``date`` appear in the text before the reminder: earlier messages, then the
    earlier parts of its own message?"""
    for message in messages:
        if any(date in text for text in _texts(message.get("content"))):
            return True
    return any(date in text for text in _texts(parts))


def _texts(content: Any) -> Iterable[str]:
    if isinstance(content, str):
        yield content
    elif isinstance(content, list):
        for part in content:
            if isinstance(part, dict) and isinstance(text := part.get("text"), str):
                yield text


RULES = {
    "claude-code-billing-header": drop_billing_header,
    "qwen-code-date-reminder": place_date_reminder,
}
