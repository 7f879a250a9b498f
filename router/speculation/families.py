"""The family of a request: a pure, cheap guess at how much of the answer will be copied.

Speculation pays where the answer repeats text the draft can know (a client's prediction, a
file rewritten with a small change, a quoted error) and not on free chat. One client sends
both kinds, so the auto-disable state is kept per (backend, model, client, preset, family),
not per client alone. The families, the first that applies:

- ``prediction``: the body carries an OpenAI ``prediction`` (``{"type": "content", ...}``
  with content): the draft is given, and it is usually most of the answer.
- ``constrained``: the answer is held to a grammar (``response_format`` ``json_schema`` or
  ``json_object``, or ``tools`` with ``tool_choice`` ``"required"`` or a named function):
  the grammar forces much of it (braces, key names, the function name), drafted for free.
- ``tools``: ``tools`` (or the legacy ``functions``) are offered: answers are short calls or
  prose about them.
- ``code-block``: the last user message (or the completion prompt) holds a long fenced code
  block or a long quoted/indented block: edits and refactors that copy it back.
- ``chat``: everything else.

Only a bounded tail of the last user message is read (``SCAN_CHARS``), so a huge prompt
costs no more than a small one.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Final

FAMILIES: Final = ("prediction", "constrained", "tools", "code-block", "chat")
JSON_FORMATS = frozenset({"json_schema", "json_object"})
SCAN_CHARS = 64 * 1024  # the tail of the last user message that is looked at
LONG_BLOCK_LINES = 8  # a fenced, quoted or indented block at least this long is "long"
LONG_BLOCK_CHARS = 400  # ... or a fenced block at least this many characters


def classify_family(data: Mapping[str, Any]) -> str:
    """The family of a chat or completions request body (already a JSON object)."""
    if _has_prediction(data.get("prediction")):
        return "prediction"
    tools, functions = data.get("tools"), data.get("functions")
    if _constrained(data, isinstance(tools, list) and bool(tools)):
        return "constrained"
    if (isinstance(tools, list) and tools) or (isinstance(functions, list) and functions):
        return "tools"
    if has_long_block(_last_user_text(data)):
        return "code-block"
    return "chat"


def _has_prediction(value: Any) -> bool:
    if value is None:  # the usual request: no isinstance check against the Mapping ABC
        return False
    if not isinstance(value, Mapping) or value.get("type") != "content":
        return False
    content = value.get("content")
    if isinstance(content, str):
        return bool(content)
    return isinstance(content, list) and any(
        isinstance(p, Mapping) and isinstance(p.get("text"), str) and p["text"] for p in content
    )


def _constrained(data: Mapping[str, Any], tools: bool) -> bool:
    """What the lanes decode under a grammar (``router.worker.decoding.constrain``): a JSON
    ``response_format``, or ``tools`` the answer must call (``tool_choice`` ``"required"``
    or a named function)."""
    response_format = data.get("response_format")  # a JSON body's objects are dicts
    if isinstance(response_format, dict) and response_format.get("type") in JSON_FORMATS:
        return True
    return tools and ((choice := data.get("tool_choice")) == "required" or isinstance(choice, dict))


def _last_user_text(data: Mapping[str, Any]) -> str:
    messages = data.get("messages")
    if isinstance(messages, list):
        for message in reversed(messages):
            if isinstance(message, Mapping) and message.get("role") == "user":
                return _text(message.get("content"))
        return ""
    prompt = data.get("prompt")
    if isinstance(prompt, list) and len(prompt) == 1:
        prompt = prompt[0]
    return prompt[-SCAN_CHARS:] if isinstance(prompt, str) else ""


def _text(content: Any) -> str:
    if isinstance(content, str):
        return content[-SCAN_CHARS:]
    if isinstance(content, list):
        parts: list[str] = []
        size = 0
        for part in reversed(content):
            if isinstance(part, Mapping) and isinstance(part.get("text"), str):
                parts.append(part["text"])
                size += len(part["text"])
                if size >= SCAN_CHARS:
                    break
        return "\n".join(reversed(parts))[-SCAN_CHARS:]
    return ""


def has_long_block(text: str) -> bool:
    """A fenced code block, or a run of quoted (``>``) or indented lines, that is long."""
    if not text:
        return False
    lines = text.split("\n")
    fenced_lines, fenced_chars, in_fence = 0, 0, False
    run = 0
    for line in lines:
        if line.lstrip().startswith(("```", "~~~")):
            if in_fence and (fenced_lines >= LONG_BLOCK_LINES or fenced_chars >= LONG_BLOCK_CHARS):
                return True
            in_fence, fenced_lines, fenced_chars = not in_fence, 0, 0
            continue
        if in_fence:
            fenced_lines += 1
            fenced_chars += len(line) + 1
            continue
        quoted = line.startswith((">", "    ", "\t"))
        run = run + 1 if quoted or (run and not line.strip()) else 0
        if run >= LONG_BLOCK_LINES:
            return True
    # An unterminated fence (the message was cut or the client forgot it) still counts.
    return in_fence and (fenced_lines >= LONG_BLOCK_LINES or fenced_chars >= LONG_BLOCK_CHARS)


def workload_key(client: str, preset: str | None, family: str) -> str:
    """The workload part of the speculative-state key and of the metrics' ``workload`` label."""
    return f"{client}:{preset or 'none'}:{family}"


def workload_parts(workload: str) -> dict[str, str | None]:
    """``workload_key``'s parts back (older two-part keys have no family)."""
    client, _, rest = workload.partition(":")
    preset, _, family = rest.partition(":")
    return {"client": client, "preset": preset or None, "family": family or None}
