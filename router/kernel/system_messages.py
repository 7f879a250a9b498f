"""Late system messages folded in place: one rule for the lanes and the external backends.

System messages may come anywhere (OpenAI ``system`` and ``developer``, Anthropic's
mid-conversation system messages, which Claude Code sends on every turn), but many chat
templates accept one system message, first: the official Qwen templates raise "System
message must be at the beginning." for any other. ``fold`` renders them one way for every
template: the leading ones become one system message; a later run becomes delimited notes
(``SYSTEM_NOTE``) at the end of the user message before it; after another turn, at the
start of the user message after it; else a user message of its own. A message's rendering
depends only on it and its neighbours, and a later turn only appends (the model's answer
first), so a conversation renders the same on every turn and every prompt cache (the
lanes', mlx_lm.server's, llama.cpp's) keeps hitting.

The notes are unambiguous: nothing but a fold writes ``<system>`` or ``</system>``. Inside a
note's text and inside every user and tool message (``ESCAPED_ROLES``: the text an agent
reads, a web page, a file, lands there) each spelling of either tag (any case, spaces
anywhere, attributes: ``TAG``) gets one backslash after its ``<`` (``escape_text``), and one
that had backslashes there gets one more, so the escape is reversible (``unescape_text``)
and a late system message holding ``</system>`` cannot close its note early, nor a user
message or a tool result hold a note byte-identical to a folded one. It depends only on the
message's own text, so the rendering stays the same turn after turn.

Pure and generic: the lanes fold their validated messages (``router.worker.request.protocol``), the
proxy folds the JSON messages it forwards to a backend set to ``system_messages = "fold"``
(``fold_json``).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

SYSTEM_ROLES = frozenset({"system", "developer"})  # developer: OpenAI's newer name for system
SYSTEM_NOTE = "<system>\n{}\n</system>"
# Where text from outside the conversation's author lands next to notes (function: OpenAI's
# older name for a tool result).
ESCAPED_ROLES = frozenset({"user", "tool", "function"})
# A spelling of a note's tags a reader might take for one: ``<``, the escape's backslashes
# (group 1), then ``system`` or ``/system`` with spaces anywhere, attributes, ``>``. Not
# ``<system-reminder>`` or ``<systems>`` (Claude Code sends the first in user messages).
TAG = re.compile(r"<(\\*)(\s*/?\s*system(?![\w-])[^<>]*>)", re.IGNORECASE)

M = TypeVar("M")


def fold(
    messages: Sequence[M],
    *,
    role: Callable[[M], str],
    text: Callable[[M], str],
    system: Callable[[str], M],
    user: Callable[[str], M],
    extend: Callable[[M, str, bool], M],
    escape: Callable[[M], M],
) -> list[M]:
    """The messages with one leading system message and late ones folded (module docstring).

    ``role``/``text``: a message's role and its text; ``system``/``user``: a new message of
    that role with a text; ``extend(user_message, notes, at_end)``: that user message with
    ``notes`` added at its end (or its start), separated by a blank line; ``escape``: a
    message of ``ESCAPED_ROLES`` with its text (every text part) through ``escape_text``
    (called only when that changes it).
    """
    messages = [_escaped(m, role, text, escape) for m in messages]
    lead = 0
    while lead < len(messages) and role(messages[lead]) in SYSTEM_ROLES:
        lead += 1
    out: list[M] = []
    if lead:
        out.append(system("\n\n".join(t for m in messages[:lead] if (t := text(m)))))
    i = lead
    while i < len(messages):
        if role(messages[i]) not in SYSTEM_ROLES:
            out.append(messages[i])
            i += 1
            continue
        end = i  # a run of later system messages makes one block of notes
        while end < len(messages) and role(messages[end]) in SYSTEM_ROLES:
            end += 1
        notes = "\n\n".join(
            SYSTEM_NOTE.format(escape_text(t)) for m in messages[i:end] if (t := text(m))
        )
        after = messages[end] if end < len(messages) else None
        i = end
        if not notes:
            continue
        if out and role(out[-1]) == "user":
            out[-1] = extend(out[-1], notes, True)
        elif after is not None and role(after) == "user":
            # Between an assistant turn and a user turn: one user turn, so templates that
            # require turns to alternate still accept it.
            out.append(extend(after, notes, False))
            i += 1
        else:
            out.append(user(notes))
    return out


def escape_text(text: str) -> str:
    """``text`` with every spelling of a note's tags (``TAG``) given one more backslash
    after its ``<``: it holds none then, and ``unescape_text`` gives ``text`` back."""
    return TAG.sub(r"<\\\1\2", text) if "<" in text else text


def unescape_text(text: str) -> str:
    """The inverse of ``escape_text``."""
    return _ESCAPED_TAG.sub(r"<\1\2", text) if "<" in text else text


_ESCAPED_TAG = re.compile(r"<\\(\\*)(\s*/?\s*system(?![\w-])[^<>]*>)", re.IGNORECASE)


def _escaped(
    m: M, role: Callable[[M], str], text: Callable[[M], str], escape: Callable[[M], M]
) -> M:
    if role(m) in ESCAPED_ROLES and TAG.search(text(m)):
        return escape(m)
    return m


def needs_fold(messages: Sequence[Any]) -> bool:
    """Whether folding changes JSON messages: a system message anywhere but first, or a
    first one named ``developer`` (what a one-system template refuses, or does not know),
    or a tag to escape in a user or tool message (whether or not notes come: the same
    message renders the same on every turn)."""
    return bool(messages) and (
        _json_role(messages[0]) == "developer"
        or any(_json_role(m) in SYSTEM_ROLES for m in messages[1:])
        or any(_json_role(m) in ESCAPED_ROLES and TAG.search(_json_text(m)) for m in messages)
    )


def fold_json(messages: list[Any]) -> list[Any]:
    """OpenAI chat messages (JSON, as forwarded) folded; a message's other fields are kept.

    A system message's text is its string content or its text parts joined; a user message
    given as parts gets the notes as one more text part (its other parts, images among
    them, stay as they are)."""
    return fold(
        messages,
        role=_json_role,
        text=_json_text,
        system=lambda t: {"role": "system", "content": t},
        user=lambda t: {"role": "user", "content": t},
        extend=_json_extend,
        escape=_json_escape,
    )


def _json_role(m: Any) -> str:
    role = m.get("role") if isinstance(m, dict) else None
    return role if isinstance(role, str) else ""


def _json_text(m: Any) -> str:
    content = m.get("content")
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(p["text"] for p in content if _is_text_part(p))
    return ""


def _json_extend(m: dict[str, Any], notes: str, at_end: bool) -> dict[str, Any]:
    content = m.get("content")
    if isinstance(content, list):
        part = {"type": "text", "text": f"\n\n{notes}" if at_end else f"{notes}\n\n"}
        if not content:
            part = {"type": "text", "text": notes}
        return {**m, "content": [*content, part] if at_end else [part, *content]}
    own = content if isinstance(content, str) else ""
    first, second = (own, notes) if at_end else (notes, own)
    return {**m, "content": f"{first}\n\n{second}" if first and second else first or second}


def _json_escape(m: dict[str, Any]) -> dict[str, Any]:
    content = m.get("content")
    if isinstance(content, str):
        return {**m, "content": escape_text(content)}
    if not isinstance(content, list):
        return m
    parts = [{**p, "text": escape_text(p["text"])} if _is_text_part(p) else p for p in content]
    if TAG.search(_json_text({"content": parts})):
        # A tag split across text parts (templates join them): the text as one part, where
        # its first part was.
        first = next(i for i, p in enumerate(content) if _is_text_part(p))
        joined = {"type": "text", "text": escape_text(_json_text(m))}
        parts = [
            joined if i == first else p
            for i, p in enumerate(content)
            if i == first or not _is_text_part(p)
        ]
    return {**m, "content": parts}


def _is_text_part(p: Any) -> bool:
    return isinstance(p, dict) and p.get("type") == "text" and isinstance(p.get("text"), str)
