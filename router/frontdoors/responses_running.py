"""The Responses door's state in the app: the store of finished responses, and the responses
still running (streams, and background responses), which ``POST /v1/responses/{id}/cancel``
stops.

A running response is known by its client and id, like a stored one: another client's id
is not found. Background responses are tasks of their own (the request that created them
was answered at once): each holds its place here until it ends, a client may have at most
``responses.max_background`` of them at once, and the app's shutdown cancels those left.
"""

from __future__ import annotations

import asyncio
import contextlib
from dataclasses import dataclass, field
from typing import Any, Protocol

# How long a cancel waits for the response to end before it answers (the upstream is closed
# at once; this bounds only the relay's last writes).
CANCEL_WAIT = 10.0


# A leaf: what it holds is named by what a cancel calls on it (``router.proxy.relay.Stop``,
# ``router.frontdoors.responses_out.ResponsesEgress``), so the services below the doors
# (``router.proxy.services``) can hold the responses running without importing the doors.
class Stoppable(Protocol):
    def request(self) -> None: ...


class Ending(Protocol):
    @property
    def final(self) -> dict[str, Any] | None: ...

    def ended_whole(self, status: str) -> dict[str, Any]: ...


@dataclass(eq=False)
class Running:
    stop: Stoppable
    egress: Ending
    background: bool = False
    done: asyncio.Event = field(default_factory=asyncio.Event)


class RunningResponses:
    def __init__(self) -> None:
        self._by_key: dict[tuple[str, str], Running] = {}
        self._tasks: set[asyncio.Task[Any]] = set()

    def add(self, client: str, resp_id: str, running: Running) -> None:
        self._by_key[(client, resp_id)] = running

    def get(self, client: str, resp_id: str) -> Running | None:
        return self._by_key.get((client, resp_id))

    def end(self, client: str, resp_id: str) -> None:
        running = self._by_key.pop((client, resp_id), None)
        if running is not None:
            running.done.set()

    def background(self, client: str) -> int:
        """The client's background responses running now."""
        return sum(1 for (c, _), r in self._by_key.items() if c == client and r.background)

    def track(self, task: asyncio.Task[Any]) -> None:
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def shutdown(self) -> None:
        """Cancel the background responses still running (their upstreams are closed)."""
        tasks = list(self._tasks)
        for task in tasks:
            task.cancel()
        with contextlib.suppress(Exception):
            await asyncio.gather(*tasks, return_exceptions=True)
