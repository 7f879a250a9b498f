"""Fake lanes told their timings and statistics, for the scorecard tests.

``ToldLane`` is the shared fake upstream (a real server on 127.0.0.1 port 0) that picks its
``Behaviour`` from the request: by prompt family (read back from the prompt text) and by
whether the request asks for speculation (``num_draft_tokens``). With ``serial`` it
answers one request at a time, as the real speculative lane does.

A behaviour of ``told(ttft, interval, tokens, drafted, accepted)`` streams its first
content chunk ``ttft`` seconds after the request arrives and the rest ``interval`` apart,
so a request measures: TTFT ~ ttft (plus queueing), decode tok/s = 1 / interval,
completion tokens = tokens, acceptance = accepted / drafted.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

from aiohttp import web

from router.bench.scorecard.prompts import FAMILIES
from tests.fakes.upstream import Behaviour, FakeUpstream

MODEL = "fake-model"


def told(
    ttft: float,
    interval: float,
    tokens: int = 30,
    drafted: int = 0,
    accepted: int = 0,
    num_draft_tokens: int = 3,
) -> Behaviour:
    # The fake sleeps ``interval`` before every content chunk and ``delay_headers`` before
    # answering: the first chunk arrives after delay_headers + interval.
    spec = {
        "drafted": drafted,
        "accepted": accepted,
        "rejected": drafted - accepted,
        "steps": drafted // max(1, num_draft_tokens),
        "num_draft_tokens": num_draft_tokens if drafted else 0,
    }
    return Behaviour(
        chunks=tokens,
        interval=interval,
        delay_headers=max(0.0, ttft - interval),
        usage_extra={"speclane_spec": spec},
    )


def family_of(body: dict[str, Any]) -> str:
    text = body["messages"][-1]["content"]
    for name, family in FAMILIES.items():
        if any(text.endswith(p) for p in family.prompts):
            return name
    raise AssertionError(f"not a bench prompt: {text[:60]!r}")


class ToldLane(FakeUpstream):
    def __init__(
        self,
        name: str,
        *,
        spec: dict[str, Behaviour] | Behaviour | None = None,
        plain: dict[str, Behaviour] | Behaviour,
        serial: bool = False,
    ) -> None:
        super().__init__(models=(MODEL,), name=name)
        self.spec = spec
        self.plain = plain
        self.serial = serial
        self.lock = asyncio.Lock()
        self.count = 0  # requests answered
        self._waiters: list[tuple[int, asyncio.Future[None]]] = []

    async def answered(self, n: int) -> None:
        """Return once ``n`` requests have been answered in all."""
        if self.count >= n:
            return
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._waiters.append((n, future))
        await future

    def behaviour_for(self, body: dict[str, Any]) -> Behaviour:
        wants_spec = self.spec is not None and body.get("num_draft_tokens") != 0
        table = self.spec if wants_spec else self.plain
        assert table is not None
        return table[family_of(body)] if isinstance(table, dict) else table

    async def _answer(
        self, request: web.Request, body: dict[str, Any], b: Behaviour
    ) -> web.StreamResponse:
        told_b = self.behaviour_for(body)
        if self.serial:
            async with self.lock:
                resp = await super()._answer(request, body, told_b)
        else:
            resp = await super()._answer(request, body, told_b)
        self.count += 1
        for n, future in self._waiters:
            if self.count >= n and not future.done():
                future.set_result(None)
        return resp


@asynccontextmanager
async def started(*lanes: ToldLane) -> AsyncIterator[tuple[ToldLane, ...]]:
    for lane in lanes:
        await lane.start()
    try:
        yield lanes
    finally:
        for lane in lanes:
            await lane.stop()
