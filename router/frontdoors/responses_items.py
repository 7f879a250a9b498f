"""A stored response's input items, and their pages (pure), for
``GET /v1/responses/{id}/input_items``.

The items are the request's ``input`` as OpenAI lists them: a string is one user message,
a message's string content becomes one ``input_text`` part (``output_text`` for the
assistant), every item has an ``id`` (the client's, else a new one) and a message a
``status``; a final ``compaction_trigger`` is not an input. Pages follow OpenAI's list
parameters: ``order`` (``desc``, newest first, by default), ``after`` and ``before`` (item
ids, exclusive), ``limit`` (1-100, 20 by default); ``include`` is accepted and has nothing
to add (images are kept by URL, as sent).
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from typing import Any, Literal

from multidict import MultiMapping

from router.frontdoors import responses_compact
from router.kernel.errors import bad_request
from router.kernel.request_rules import ascii_int

DEFAULT_LIMIT = 20
MAX_LIMIT = 100
MAX_INCLUDE = 16
PREFIXES = {"message": "msg", "function_call": "fc", "function_call_output": "fco"}


def input_items(value: Any) -> list[dict[str, Any]]:
    """The items of an ``input`` the door accepted (``responses_in.to_openai`` checked it)."""
    if isinstance(value, str):
        value = [{"type": "message", "role": "user", "content": value}]
    if not isinstance(value, list):
        return []
    items = []
    for item in value:
        if not isinstance(item, dict) or item.get("type") == responses_compact.TRIGGER:
            continue
        kind = item.get("type", "message")
        out = {**item, "type": kind}
        if not isinstance(out.get("id"), str) or not out["id"]:
            out["id"] = f"{PREFIXES.get(kind, 'item')}_{uuid.uuid4().hex}"
        if kind == "message":
            content = out.get("content")
            if isinstance(content, str):
                part = "output_text" if out.get("role") == "assistant" else "input_text"
                out["content"] = [{"type": part, "text": content}]
            out.setdefault("status", "completed")
        items.append(out)
    return items


@dataclass(frozen=True, slots=True)
class PageQuery:
    order: Literal["asc", "desc"] = "desc"
    after: str | None = None
    before: str | None = None
    limit: int = DEFAULT_LIMIT


def page_query(query: MultiMapping[str]) -> PageQuery:
    """The list parameters of a query string; a 400 naming the bad one."""
    order = query.get("order", "desc")
    if order not in ("asc", "desc"):
        raise bad_request("'order' must be 'asc' or 'desc'", param="order")
    limit = ascii_int(query.get("limit", str(DEFAULT_LIMIT)), 1, MAX_LIMIT, param="limit")
    if len(query.getall("include", [])) > MAX_INCLUDE:
        raise bad_request(f"'include' takes at most {MAX_INCLUDE} values", param="include")
    return PageQuery(
        order="asc" if order == "asc" else "desc",
        after=query.get("after") or None,
        before=query.get("before") or None,
        limit=limit,
    )


def page(items: list[dict[str, Any]], q: PageQuery) -> dict[str, Any]:
    """One page of ``items`` as OpenAI's list object; an ``after``/``before`` id that is
    none of the items is a 400, as a cursor that points nowhere."""
    ordered = items if q.order == "asc" else items[::-1]
    ids = [item["id"] for item in ordered]
    start, end = 0, len(ordered)
    if q.after is not None:
        start = _index(ids, q.after, "after") + 1
    if q.before is not None:
        end = _index(ids, q.before, "before")
    window = ordered[start:end] if start < end else []
    data = window[: q.limit]
    return {
        "object": "list",
        "data": data,
        "first_id": data[0]["id"] if data else None,
        "last_id": data[-1]["id"] if data else None,
        "has_more": len(window) > len(data),
    }


def _index(ids: list[str], item_id: str, param: str) -> int:
    try:
        return ids.index(item_id)
    except ValueError:
        raise bad_request(
            f"'{param}': no input item '{item_id[:256]}' in this response", param=param
        ) from None
