"""After each request: metrics from its Outcome (and, later, speculative telemetry)."""

from __future__ import annotations

import time

from router.metrics import Metrics
from router.proxy.relay import Outcome


def record(metrics: Metrics, outcome: Outcome) -> None:
    finished = outcome.finished_at or time.monotonic()
    backend = outcome.backend.name if outcome.backend else "none"
    status = "499" if outcome.client_gone else str(outcome.status or 0)
    api = outcome.api
    metrics.requests.labels(outcome.endpoint, backend, status, api).inc()
    metrics.request_duration.labels(outcome.endpoint, backend, api).observe(
        finished - outcome.arrival)
    if outcome.ttft is not None:
        metrics.ttft.labels(outcome.endpoint, backend, api).observe(outcome.ttft)
    if outcome.client_gone:
        metrics.client_disconnects.labels(backend).inc()
