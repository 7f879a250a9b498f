"""Stored responses, for ``previous_response_id`` and ``GET``/``DELETE /v1/responses/{id}``.

In memory only (a restart forgets them), bounded by a number of responses and by their total
size, the least recently used evicted first. Each entry holds the response object and its
whole conversation as chat messages (a follow-up turn reads one entry, never a chain), and
the request's input items (``GET /v1/responses/{id}/input_items``). Keys
include the client: a response id is visible only to the client that created it.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any

import orjson


@dataclass(frozen=True, slots=True)
class Stored:
    response: dict[str, Any]
    messages: list[dict[str, Any]]
    size: int
    items: list[dict[str, Any]] = field(default_factory=list)  # the request's input items


class ResponseStore:
    def __init__(self, max_entries: int, max_bytes: int) -> None:
        self.max_entries = max_entries
        self.max_bytes = max_bytes
        self.bytes = 0
        self._entries: OrderedDict[tuple[str, str], Stored] = OrderedDict()

    def __len__(self) -> int:
        return len(self._entries)

    def put(
        self,
        client: str,
        resp_id: str,
        response: dict[str, Any],
        messages: list[dict[str, Any]],
        items: list[dict[str, Any]] | None = None,
    ) -> bool:
        """Keep a response; False when it alone is larger than the whole store."""
        items = items or []
        size = len(orjson.dumps(response)) + len(orjson.dumps(messages)) + len(orjson.dumps(items))
        if size > self.max_bytes or self.max_entries < 1:
            return False
        self.delete(client, resp_id)
        self._entries[(client, resp_id)] = Stored(response, messages, size, items)
        self.bytes += size
        while len(self._entries) > self.max_entries or self.bytes > self.max_bytes:
            _, old = self._entries.popitem(last=False)
            self.bytes -= old.size
        return True

    def get(self, client: str, resp_id: str) -> Stored | None:
        entry = self._entries.get((client, resp_id))
        if entry is not None:
            self._entries.move_to_end((client, resp_id))
        return entry

    def delete(self, client: str, resp_id: str) -> bool:
        entry = self._entries.pop((client, resp_id), None)
        if entry is None:
            return False
        self.bytes -= entry.size
        return True
