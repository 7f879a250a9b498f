"""After each request: metrics from its Outcome (and, later, speculative telemetry)."""

from __future__ import annotations

import time

from router.metrics import Metrics
from router.proxy.outcome import Outcome


def booked_backend(outcome: Outcome) -> str:
    """The backend a request is booked to: the one that answered, else the last one tried
    (a 504 from a lane that timed out belongs to that lane), else "none" (refused before
    any backend was tried: bad request, no route, 429, 401...)."""
    backend = outcome.backend or outcome.tried
    return backend.name if backend is not None else "none"


def booked_model(outcome: Outcome) -> str:
    """The model a request is booked to: the served model it was routed to, else "none" (a
    name no backend serves never becomes a label: clients cannot grow the series)."""
    if outcome.model is None or (outcome.backend or outcome.tried) is None:
        return "none"
    return outcome.model


def record(metrics: Metrics, outcome: Outcome) -> None:
    finished = outcome.finished_at or time.monotonic()
    backend = booked_backend(outcome)
    model = booked_model(outcome)
    status = "499" if outcome.client_gone else str(outcome.status or 0)
    api = outcome.api
    metrics.requests.labels(outcome.endpoint, backend, status, api, model).inc()
    metrics.request_duration.labels(outcome.endpoint, backend, api, model).observe(
        finished - outcome.arrival
    )
    # Streams only: a non-streaming answer's "first byte" is the whole answer.
    if outcome.stream and outcome.ttft is not None:
        metrics.ttft.labels(outcome.endpoint, backend, api, model).observe(outcome.ttft)
    if outcome.client_gone:
        metrics.client_disconnects.labels(backend).inc()
