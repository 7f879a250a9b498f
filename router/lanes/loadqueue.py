"""The places of requests waiting for models to load (``lanes.load_queue``), shared fairly
between clients as the prompt cache is: when every place is taken, a newcomer takes the
newest place of the client holding the most, as long as that client then still holds at
least as many as the newcomer's; otherwise the newcomer is refused. So one client's flood
can fill the queue only while nobody else waits, and another client's request always gets
in while the biggest holder has two places more than its client.

``choose`` is the decision (pure); ``LoadQueue`` keeps the places, each an ``asyncio``
future its waiter watches: resolved when the place is taken from it.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from dataclasses import dataclass, field


def choose(held: Mapping[str, int], client: str, limit: int) -> str | None:
    """Who gives up a place so that ``client`` gets one: ``client`` itself when a place is
    free, the biggest other holder when it holds at least two more than ``client``, else
    None (refused). Ties between holders go to the name first in order (deterministic)."""
    if sum(held.values()) < limit:
        return client
    others = sorted((-n, c) for c, n in held.items() if c != client and n > 0)
    if not others:
        return None
    most, biggest = -others[0][0], others[0][1]
    return biggest if most >= held.get(client, 0) + 2 else None


@dataclass
class LoadQueue:
    limit: int
    _places: dict[str, list[asyncio.Future[None]]] = field(default_factory=dict)

    def __len__(self) -> int:
        return sum(len(p) for p in self._places.values())

    def held(self) -> dict[str, int]:
        return {c: len(p) for c, p in self._places.items() if p}

    def enter(self, client: str) -> asyncio.Future[None] | None:
        """A place for ``client`` (None: refused). The returned future is resolved when the
        place is taken back for another client's request."""
        giver = choose(self.held(), client, self.limit)
        if giver is None:
            return None
        if giver != client:
            bumped = self._places[giver].pop()  # its newest: the one that waited least
            if not bumped.done():
                bumped.set_result(None)
        place: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._places.setdefault(client, []).append(place)
        return place

    def leave(self, client: str, place: asyncio.Future[None]) -> None:
        places = self._places.get(client, [])
        if place in places:
            places.remove(place)
        if not places:
            self._places.pop(client, None)
