"""One request's bookkeeping, the same for every door: what ended it, booked on its
``Outcome`` as the client gets it, then its metrics and its access log line, whatever ended
it (an answer, an error, the client leaving)."""

from __future__ import annotations

import asyncio
import time
from types import TracebackType
from typing import Self

from router.kernel import errors
from router.kernel.errors import RouterError
from router.proxy import observe
from router.proxy.accesslog import record_of
from router.proxy.outcome import Outcome
from router.proxy.services import Services


class Booking:
    """``with Booking(services, outcome) as book:`` around a request's work; the door fills
    in what the access log names as it learns it (``client``, ``model``, ``decision``).

    ``served_model``: the access log names the model that served (one of ours may be
    aliased) over the one asked for. A door with more to do at the end overrides ``ended``,
    called after the metrics and before the access log line. A plain (not async) context
    manager: the bookkeeping awaits nothing, and a class costs less per request than a
    generator."""

    __slots__ = ("client", "decision", "model", "outcome", "served_model", "services")

    def __init__(self, services: Services, outcome: Outcome, *, served_model: bool = False):
        self.services, self.outcome, self.served_model = services, outcome, served_model
        self.client = "unidentified"
        self.model: str | None = None
        self.decision: str | None = None

    def failed(self, error: RouterError) -> None:
        self.outcome.status, self.outcome.error = error.status, error

    def ended(self) -> None:
        """The door's own end of a request (none by default)."""

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        outcome = self.outcome
        if isinstance(error, RouterError):
            self.failed(error)
        elif isinstance(error, asyncio.CancelledError):
            outcome.client_left()  # not a disconnect once the stream's [DONE] reached the client
        elif isinstance(error, Exception):  # the error middleware answers 500 internal_error
            self.failed(errors.internal_error())  # booked as the client gets it
        outcome.finished_at = time.monotonic()
        services = self.services
        observe.record(services.metrics, outcome)
        self.ended()
        model = (outcome.model or self.model) if self.served_model else self.model
        record = record_of(outcome, client=self.client, model=model, decision=self.decision)
        services.access.add(record)
