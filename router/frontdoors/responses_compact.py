"""Compaction on the Responses door (pure): a conversation turned into one ``compaction``
item that later requests send back in its place.

OpenAI's compaction returns an opaque item (``{"type": "compaction", "encrypted_content"}``)
that only its servers can read back. Codex asks for it when it takes its provider for an
OpenAI endpoint: a ``compaction_trigger`` item at the end of a ``/v1/responses`` input (and
``POST /v1/responses/compact`` in older versions), and it fails the turn when the answer
holds no compaction item. Here the model writes the summary (the conversation plus
``PROMPT``; the tools stay offered as they were, so the long prefix is the one the prompt
cache holds, and a call in the answer is ignored); the item carries that summary, encoded,
not encrypted (it is the client's own conversation); sent back, it becomes a user message
that opens with ``PREAMBLE``.
"""

from __future__ import annotations

import base64
import binascii
import uuid
from typing import Any

from router.kernel.errors import bad_request

TRIGGER = "compaction_trigger"
ITEMS = frozenset({"compaction", "compaction_summary"})  # what clients send the item back as
PREFIX = "speclane-compaction-1:"
PROMPT = (
    "Context checkpoint: the conversation above is about to be replaced by your summary. "
    "Write a handoff summary for yourself to continue the task from: the user's goal and "
    "constraints, what has been done (files, commands, results), decisions made, what is "
    "left to do and the next step. Be concise and specific; do not call any tool."
)
PREAMBLE = (
    "Summary of the conversation so far (earlier turns were compacted into it); continue "
    "the task from here:\n\n"
)


def encode(summary: str) -> str:
    return PREFIX + base64.urlsafe_b64encode(summary.encode()).decode()


def decode(item: dict[str, Any], at: str) -> str:
    """The summary a compaction item carries; 400 when it is not one speclane wrote."""
    content = item.get("encrypted_content")
    if isinstance(content, str) and content.startswith(PREFIX):
        try:
            raw = content[len(PREFIX) :].encode()
            return base64.b64decode(raw, altchars=b"-_", validate=True).decode()
        except (binascii.Error, ValueError):
            pass
    raise bad_request(
        f"'{at}.encrypted_content' is not a compaction speclane made (compaction items are "
        "read back only by the server that made them)",
        param=at,
        code="invalid_encrypted_content",
    )


def summary_message(summary: str) -> dict[str, Any]:
    return {"role": "user", "content": PREAMBLE + summary}


def item(summary: str) -> dict[str, Any]:
    summary = summary.strip()
    return {
        "id": f"cmp_{uuid.uuid4().hex}",
        "type": "compaction",
        "encrypted_content": encode(summary),
    }


def split_trigger(items: list[Any]) -> tuple[list[Any], bool]:
    """(the input without its final ``compaction_trigger``, whether it had one); a trigger
    anywhere else is a 400."""
    triggered = bool(items) and isinstance(items[-1], dict) and items[-1].get("type") == TRIGGER
    rest = items[:-1] if triggered else items
    for i, entry in enumerate(rest):
        if isinstance(entry, dict) and entry.get("type") == TRIGGER:
            raise bad_request(
                f"'input[{i}]': a compaction_trigger must be the last input item",
                param=f"input[{i}]",
            )
    return rest, triggered
