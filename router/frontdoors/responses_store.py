"""Stored responses, for ``previous_response_id`` and ``GET``/``DELETE /v1/responses/{id}``.

In memory only (a restart forgets them), bounded by a number of responses and by their total
size. Each entry holds the response object and its whole conversation as chat messages (a
follow-up turn reads one entry, never a chain), and the request's input items (``GET
/v1/responses/{id}/input_items``), kept as their compact JSON bytes: what the
bound counts is what the entry holds (its bytes and a fixed ``ENTRY_OVERHEAD``), not the
several times larger tree of Python objects the JSON would make.

Entries belong to an owner (``router.proxy.handlers.owner``: the client, apart by whether a
key proved it): a response id is visible only to the owner that created it. The bounds are
shared fairly between owners, as the lanes' prompt cache shares its own: past a bound, the
owner holding the most (entries for the count bound, bytes for the size bound) gives up its
least recently used entry first, so one client storing many large responses evicts its own
before another client's few.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import orjson

# What one entry costs besides its JSON bytes: its key tuple, the two bytes objects' headers,
# its place in two dictionaries. Counted so that a flood of tiny entries is bounded too.
ENTRY_OVERHEAD = 512


def _compact(value: Any) -> bytes:
    """Its JSON in an object of its own size: orjson's result keeps the buffer it grew (a
    12 KiB text held 64 KiB), so it is copied out exactly and the buffer freed."""
    return bytes(memoryview(orjson.dumps(value)))


@dataclass(frozen=True, slots=True)
class Stored:
    response_json: bytes
    messages_json: bytes
    items_json: bytes = b"[]"  # the request's input items

    @property
    def size(self) -> int:
        held = len(self.response_json) + len(self.messages_json) + len(self.items_json)
        return held + ENTRY_OVERHEAD

    @property
    def response(self) -> dict[str, Any]:
        value: dict[str, Any] = orjson.loads(self.response_json)
        return value

    @property
    def messages(self) -> list[dict[str, Any]]:
        value: list[dict[str, Any]] = orjson.loads(self.messages_json)
        return value

    @property
    def items(self) -> list[dict[str, Any]]:
        value: list[dict[str, Any]] = orjson.loads(self.items_json)
        return value


class ResponseStore:
    def __init__(self, max_entries: int, max_bytes: int) -> None:
        self.max_entries = max_entries
        self.max_bytes = max_bytes
        self.bytes = 0
        self._count = 0
        self._owners: dict[str, OrderedDict[str, Stored]] = {}
        self._owner_bytes: dict[str, int] = {}

    def __len__(self) -> int:
        return self._count

    def held(self, owner: str) -> tuple[int, int]:
        """(entries, bytes) ``owner`` holds."""
        return len(self._owners.get(owner, ())), self._owner_bytes.get(owner, 0)

    def put(
        self,
        owner: str,
        resp_id: str,
        response: dict[str, Any],
        messages: list[dict[str, Any]],
        items: list[dict[str, Any]] | None = None,
    ) -> bool:
        """Keep a response; False when it alone is larger than the whole store."""
        entry = Stored(_compact(response), _compact(messages), _compact(items or []))
        if entry.size > self.max_bytes or self.max_entries < 1:
            return False
        self.delete(owner, resp_id)
        self._owners.setdefault(owner, OrderedDict())[resp_id] = entry
        self._owner_bytes[owner] = self._owner_bytes.get(owner, 0) + entry.size
        self.bytes += entry.size
        self._count += 1
        while self._count > self.max_entries:
            self._evict(lambda o: len(self._owners[o]), (owner, resp_id))
        while self.bytes > self.max_bytes:
            self._evict(self._owner_bytes.__getitem__, (owner, resp_id))
        return True

    def get(self, owner: str, resp_id: str) -> Stored | None:
        entries = self._owners.get(owner)
        entry = entries.get(resp_id) if entries is not None else None
        if entries is not None and entry is not None:
            entries.move_to_end(resp_id)
        return entry

    def delete(self, owner: str, resp_id: str) -> bool:
        entries = self._owners.get(owner)
        entry = entries.pop(resp_id, None) if entries is not None else None
        if entries is None or entry is None:
            return False
        self._forget(owner, entry)
        return True

    def _evict(self, measure: Callable[[str], int], keep: tuple[str, str]) -> None:
        """The least recently used entry of the owner holding the most by ``measure``,
        never ``keep`` (the entry just stored: it fits alone)."""
        for name in sorted(self._owners, key=lambda o: (-measure(o), o)):
            entries = self._owners[name]
            victim = next((k for k in entries if (name, k) != keep), None)
            if victim is not None:
                self._forget(name, entries.pop(victim))
                return
        raise AssertionError("nothing to evict but the entry just stored")  # it fits alone

    def _forget(self, owner: str, entry: Stored) -> None:
        self.bytes -= entry.size
        self._count -= 1
        self._owner_bytes[owner] -= entry.size
        if not self._owners[owner]:
            del self._owners[owner]
            del self._owner_bytes[owner]
