"""After each request: the metrics of its Outcome, and the speculative statistics its answer
reported (``SpecCounts``: parsed once, counted for Prometheus, handed to the speculation
decision's ``complete``, ``router.proxy.speculation``)."""

from __future__ import annotations

import logging
import time

from router.backends.base import Backend
from router.backends.pool import BackendPool
from router.metrics import Metrics
from router.proxy.outcome import Outcome
from router.routing.speculate import EXTERNAL_SOURCE, candidate_source
from router.speculation.cumulative import CounterDelta
from router.speculation.observed import GAUGE, ObservedWindow, observable
from router.speculation.parsers import parse_response, parse_stream_events
from router.speculation.record import Observation, SpecRecord, SpecResult, unavailable_reason

log = logging.getLogger("speclane.spec")

# What one completed answer reported: its parsed statistics, and its decode speed (streams).
Seen = tuple[SpecResult, Observation | None]


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


class SpecCounts:
    """The speculative statistics of every answer and every scrape, counted, and whether each
    backend asked to speculate is seen to (``speclane_spec_observed``)."""

    def __init__(self, metrics: Metrics, pool: BackendPool) -> None:
        self._metrics = metrics
        self._observed: dict[str, ObservedWindow] = {}
        self._per_request_seen: set[str] = set()
        for backend in pool:
            if unobservable(backend):
                # Said once, from the start: no response will ever tell more (the admin
                # views say why, from the backend's kind).
                metrics.spec_observed.labels(backend.name).set(GAUGE["unobservable"])

    def answer(self, outcome: Outcome, model: str, workload: str) -> Seen | None:
        """A completed answer's statistics, counted under (model, workload); None (nothing
        counted) when the request failed or its client left."""
        backend, served = outcome.backend, outcome.candidate
        if backend is None or served is None or not outcome.completed or outcome.client_gone:
            return None
        if outcome.body_json is not None:
            result = parse_response(backend.kind, outcome.body_json)
        else:
            result = parse_stream_events(backend.kind, outcome.tail_events)
        self._count(backend, model, workload, candidate_source(served), result)
        observation = observation_of(outcome)
        if observation is not None and (tps := observation.decode_tps()) is not None:
            speculative = isinstance(result, SpecRecord) and result.drafted > 0
            self._metrics.decode_tps.labels(served.lane, str(speculative).lower()).observe(tps)
        return result, observation

    def _count(
        self, backend: Backend, model: str, workload: str, source: str, result: SpecResult
    ) -> None:
        m = self._metrics
        if isinstance(result, SpecRecord):
            labels = (backend.name, model, workload, source)
            m.spec_draft_tokens.labels(*labels).inc(result.drafted)
            m.spec_accepted_tokens.labels(*labels).inc(result.accepted)
            m.spec_rejected_tokens.labels(*labels).inc(result.rejected)
            m.spec_ignored_tokens.labels(*labels).inc(result.ignored)
            by_source = result.by_source or (
                (result.draft_source or result.kind, result.drafted, result.accepted),
            )
            for name, drafted, accepted in by_source:
                m.spec_source_tokens.labels(backend.name, model, name, "drafted").inc(drafted)
                m.spec_source_tokens.labels(backend.name, model, name, "accepted").inc(accepted)
            self._per_request_seen.add(backend.name)
        else:
            reason = unavailable_reason(result) or "unknown"
            m.spec_telemetry_unavailable.labels(backend.name, reason).inc()
        if backend.speculative_requested and observable(backend.kind):
            window = self._observed.setdefault(backend.name, ObservedWindow())
            # A lane that chose plain decoding at every step ran its drafter: not "missing".
            running = isinstance(result, SpecRecord) and result.drafted > 0
            window.add(running or unavailable_reason(result) == "declined")
            self.set_observed(backend, window.observed, window.reason())

    def cumulative(self, backend: Backend, deltas: list[CounterDelta]) -> None:
        """Scraped counter deltas: counted under workload "cumulative", unless the backend
        also reports per response (then they are the same drafts counted twice)."""
        m = self._metrics
        for d in deltas:
            if d.restarted:
                m.spec_counter_resets.labels(backend.name).inc()
            if isinstance(d.result, SpecRecord) and backend.name not in self._per_request_seen:
                labels = (backend.name, d.key.model or "unknown", "cumulative", EXTERNAL_SOURCE)
                m.spec_draft_tokens.labels(*labels).inc(d.result.drafted)
                m.spec_accepted_tokens.labels(*labels).inc(d.result.accepted)
                m.spec_rejected_tokens.labels(*labels).inc(d.result.rejected)
                m.spec_ignored_tokens.labels(*labels).inc(d.result.ignored)
            elif d.result is not None and not isinstance(d.result, SpecRecord):
                reason = f"malformed_{d.result.reason}"
                m.spec_telemetry_unavailable.labels(backend.name, reason).inc()
        if backend.speculative_requested and any(
            isinstance(d.result, SpecRecord) and d.result.drafted for d in deltas
        ):
            self.set_observed(backend, True, None)

    def set_observed(self, backend: Backend, observed: bool | None, reason: str | None) -> None:
        was = backend.spec_observed
        if not backend.observed(observed, reason):
            return
        if observed is not None:
            self._metrics.spec_observed.labels(backend.name).set(
                GAUGE["observed" if observed else "not_observed"]
            )
        if observed is False and was is not False:
            log.warning("backend %s: %s", backend.name, reason)


def unobservable(backend: Backend) -> bool:
    """An external backend asked to speculate whose kind reports no statistics."""
    return backend.lane is None and backend.speculative_requested and not observable(backend.kind)


def model_of(outcome: Outcome) -> str | None:
    """The model the answer names."""
    body = outcome.body_json or (outcome.tail_events[-1] if outcome.tail_events else None)
    model = body.get("model") if isinstance(body, dict) else None
    return model if isinstance(model, str) else None


def observation_of(outcome: Outcome) -> Observation | None:
    """Decode speed is only seen on streams: a non-streaming body arrives all at once."""
    if not outcome.stream or outcome.first_byte_at is None or outcome.last_byte_at is None:
        return None
    tokens = outcome.reported_tokens()  # a stream's: shared with the access log
    if tokens is None:
        return None
    return Observation(
        output_tokens=tokens,
        decode_seconds=outcome.last_byte_at - outcome.first_byte_at,
        ttft_seconds=outcome.ttft,
        solo=outcome.solo,
    )
