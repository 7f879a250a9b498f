"""What happened to one relayed request: written by the relay, read by the metrics
(``router.proxy.observe``) and by the speculation decision (``router.proxy.speculation``)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from router.backends.base import Backend
from router.kernel.errors import RouterError
from router.kernel.worker_contract import STREAM_USAGE_FIELD
from router.routing.types import Candidate
from router.speculation.parsers import output_tokens


@dataclass(slots=True)
class Outcome:
    """What happened to one relayed request; read by metrics and speculative telemetry."""

    endpoint: str
    arrival: float
    api: str = "openai"  # the front door the client came through (doorerrors.Api)
    model: str | None = None  # the model routed (set once classification accepted it)
    status: int = 0
    backend: Backend | None = None
    candidate: Candidate | None = None
    tried: Backend | None = None  # the last backend an attempt went to (booked on failures)
    stream: bool = False
    attempts: int = 0
    first_byte_at: float | None = None  # first upstream body byte (monotonic)
    last_byte_at: float | None = None
    finished_at: float | None = None
    completed: bool = False  # the upstream answer arrived whole
    client_gone: bool = False
    # A stream's final events ([DONE]) reached the client: it got everything, so a close
    # from its side after this moment is not a disconnect.
    delivered: bool = False
    error: RouterError | None = None
    body_json: dict[str, Any] | None = None  # non-streaming answer
    tail_events: list[dict[str, Any]] = field(default_factory=list)  # last events of a stream
    # The prompt-normalisation rules that changed the request (router.proxy.normalise).
    normalised: tuple[str, ...] = ()
    # Its lane read less from its cache than the conversation's previous request left there
    # (router.routing.prefixwatch): what, in words.
    prefix_break: str | None = None
    solo: bool = True  # no other request was in flight on the backend meanwhile
    # requests in flight on the backend on average while this one ran (itself included)
    rows: float | None = None
    _rows_mark: tuple[float, float] = (0.0, 0.0)  # (backend.rows_mark, monotonic) at its start
    _epoch: int = 0
    # reported_tokens(), remembered with the answer it was read from
    _tokens: tuple[object, object, int | None] | None = None

    @property
    def ttft(self) -> float | None:
        return None if self.first_byte_at is None else self.first_byte_at - self.arrival

    def reported_tokens(self) -> int | None:
        """The output tokens the backend reported: in the body of a non-streaming answer,
        else in the newest of a stream's last events that has a count. Read once for the
        access log and the telemetry both (again only if the answer read changed)."""
        body, events = self.body_json, self.tail_events
        memo = self._tokens
        if memo is not None and memo[0] is body and memo[1] is events:
            return memo[2]
        tokens = None
        if body is not None:
            tokens = output_tokens(body)
        else:
            for event in reversed(events):
                tokens = output_tokens(event)
                if tokens is not None:
                    break
        self._tokens = (body, events, tokens)
        return tokens

    def reported_usage(self) -> dict[str, Any] | None:
        """The ``usage`` object the backend reported: the body's, else the newest of a
        stream's last events that has one (a lane's stream whose client asked for no usage
        carries it as ``STREAM_USAGE_FIELD``)."""
        if self.body_json is not None:
            usage = self.body_json.get("usage")
            return usage if isinstance(usage, dict) else None
        for event in reversed(self.tail_events):
            for key in ("usage", STREAM_USAGE_FIELD):
                usage = event.get(key)
                if isinstance(usage, dict):
                    return usage
        return None

    def client_left(self) -> None:
        """The client closed (or its connection broke): a disconnect unless it already had
        the whole answer."""
        if not self.delivered:
            self.client_gone = True
