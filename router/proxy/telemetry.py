"""Speculative telemetry and auto-disable, wired to requests (the I/O side of router/speculation).

Whether a request speculates is decided in ``router.routing.speculate`` (pure); this module
feeds it the workload's state and carries out what it decides. Per request:
1. ``advise(model, workload, source)`` gives classification a side-effect-free view of the
   workload's state (``AutoDisable.peek``).
2. ``claim_route(result, claim)`` runs after classification: when the first candidate
   speculates it takes the key's verdict for real, so a probe (or a baseline sample, which
   runs on the same lane with ``num_draft_tokens: 0``) is handed to exactly one request.
3. ``observe(outcome, claim)`` after the response: parses the backend's statistics from
   the body or the stream's final events, counts them in the metrics, feeds the
   auto-disable windows (speculative runs) or the baseline (plain runs), and logs and
   counts every state change once.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from dataclasses import dataclass
from typing import Any

from router.backends.base import Backend
from router.backends.pool import BackendPool
from router.config.policies import PolicySet
from router.config.settings import Settings
from router.config.speculation import SpecSettings
from router.metrics import Metrics
from router.proxy.outcome import Outcome
from router.routing.classify import Classification
from router.routing.speculate import (
    EXTERNAL_SOURCE,
    SpecAdvice,
    candidate_source,
    paused_last,
    probe_decision,
    settle,
    speculates,
)
from router.routing.types import Candidate, Decision
from router.speculation.autodisable import AutoDisable, Transition
from router.speculation.cumulative import CounterDelta
from router.speculation.keystate import SpecKey
from router.speculation.observed import (
    GAUGE,
    ObservedWindow,
    observable,
    speculation_status,
)
from router.speculation.parsers import parse_response, parse_stream_events
from router.speculation.record import (
    NotReported,
    Observation,
    SpecRecord,
    SpecResult,
    unavailable_reason,
)

log = logging.getLogger("speclane.spec")


@dataclass
class SpecClaim:
    """What one request was told about speculation; returned when it finishes."""

    model: str = ""
    workload: str = ""
    key: SpecKey | None = None  # the key whose verdict was taken
    ticket: int | None = None
    probe: bool = False
    baseline: bool = False


class SpecTelemetry:
    def __init__(
        self, settings: Settings, metrics: Metrics, pool: BackendPool, policies: Any
    ) -> None:
        self._settings = settings.spec
        self._metrics = metrics
        self._pool = pool
        self._policies = policies  # a callable returning the current PolicySet
        self.auto = AutoDisable(settings.spec, resolve=self._resolve)
        self._observed: dict[str, ObservedWindow] = {}
        self._per_request_seen: set[str] = set()
        for backend in pool:
            if _unobservable(backend):
                # Said once, from the start: no response will ever tell more (the admin
                # views say why, from the backend's kind).
                metrics.spec_observed.labels(backend.name).set(GAUGE["unobservable"])

    def _resolve(self, key: SpecKey) -> SpecSettings:
        policies: PolicySet = self._policies()
        policy = policies.get(key.workload.split(":", 1)[0])
        return self._settings.merged(policy.spec if policy else None)

    def policies_reloaded(self, ok: bool) -> None:
        """A policy's ``[spec]`` overrides reach the workloads that already have a state
        (windows resized, states kept); new workloads read them anyway."""
        if ok:
            self.auto.reconfigure(self._settings, resolve=self._resolve)

    # --- before routing -----------------------------------------------------------------

    def advise(self, model: str, workload: str, source: str) -> SpecAdvice:
        """The workload's state on the speculative lane with ``source``, peeked: nothing is
        taken."""
        key = SpecKey("speculative", model, workload, source)  # advise_lane's, inline
        verdict = self.auto.peek(key, time.monotonic())
        return SpecAdvice(use=verdict.use_speculation and not verdict.probe, probe=verdict.probe)

    def advise_batching(self, model: str, workload: str, source: str) -> SpecAdvice:
        """The same, on the batching lane (judged apart: its own key)."""
        return self.advise_lane("batching", model, workload, source)

    def advise_lane(self, lane: str, model: str, workload: str, source: str) -> SpecAdvice:
        key = SpecKey(lane, model, workload, source)
        verdict = self.auto.peek(key, time.monotonic())
        return SpecAdvice(use=verdict.use_speculation and not verdict.probe, probe=verdict.probe)

    def claim_route(self, result: Classification, claim: SpecClaim) -> Decision:
        """Take the verdict for the first candidate when it speculates (a probe or a baseline
        sample goes to exactly this request); the decision is ``router.routing.speculate``'s."""
        decision = result.decision
        claim.model, claim.workload = result.model, result.workload
        now = time.monotonic()
        candidates = paused_last(decision.candidates, lambda c: self._paused(c, claim, now))
        first = candidates[0]
        backend = self._pool[first.backend]
        if not speculates(backend.lane, _judged(backend), first):
            return _with(decision, candidates)
        # Whose state: a lane of ours by its lane name (the model is its own part of the key,
        # so a model loaded on demand finds its state), an external backend by its name.
        key = SpecKey(
            backend.lane or backend.name, claim.model, claim.workload, candidate_source(first)
        )
        verdict = self.auto.verdict(key, now)
        settled = settle(
            candidates,
            backend.lane,
            verdict.use_speculation,
            verdict.probe,
            verdict.reason == "baseline_sample",
        )
        claim.key, claim.probe, claim.baseline = key, verdict.probe, settled.baseline
        claim.ticket = verdict.ticket
        if verdict.probe:
            self._metrics.spec_probes.labels(*key).inc()
            log.info("probing speculation for %s", "/".join(key))
            if backend.lane is None:
                decision = probe_decision(decision, backend.name)
        if not settled.keep_ticket and claim.ticket is not None:
            self.auto.cancel(claim.ticket, now)
            claim.ticket = None
        return _with(decision, settled.candidates)

    def _paused(self, candidate: Candidate, claim: SpecClaim, now: float) -> bool:
        """An external backend configured as speculative whose workload is off."""
        b = self._pool[candidate.backend]
        return (
            b.lane is None
            and _judged(b)
            and not self.auto.peek(
                SpecKey(b.name, claim.model, claim.workload, candidate_source(candidate)), now
            ).use_speculation
        )

    # --- after the response -------------------------------------------------------------

    def observe(self, outcome: Outcome, claim: SpecClaim) -> None:
        backend, served = outcome.backend, outcome.candidate
        now = time.monotonic()
        if backend is None or served is None or not outcome.completed or outcome.client_gone:
            self._release(claim, now)
            return
        result = self._parse(backend, outcome)
        model = claim.model or _model_of(outcome) or "unknown"
        workload = claim.workload or "unclassified"
        source = candidate_source(served)
        self._count(backend, model, workload, source, result)
        observation = _observation(outcome)
        if observation is not None and observation.decode_tps() is not None:
            speculative = isinstance(result, SpecRecord) and result.drafted > 0
            self._metrics.decode_tps.labels(served.lane, str(speculative).lower()).observe(
                observation.decode_tps() or 0.0
            )
        key = SpecKey(backend.lane or backend.name, model, workload, source)  # as claim_route
        if claim.key is not None and claim.key != key:
            self._release(claim, now)  # a retry moved it to another backend
            claim.ticket = None
        if speculates(backend.lane, _judged(backend), served) and not _ran_plain(backend, result):
            transitions = self.auto.record(key, result, observation, now, claim.ticket)
            self._publish(key, transitions)
        elif _unobservable(backend):
            self._release(claim, now)  # drafting, unseen: neither a sample nor a baseline
        elif observation is not None:
            if claim.ticket is not None and not claim.baseline:
                self.auto.cancel(claim.ticket, now)  # a probe that did not speculate
                claim.ticket = None
            ticket = claim.ticket if claim.baseline else None
            lane = backend.lane or backend.name
            self.auto.record_baseline(model, workload, observation, now, ticket, lane)
        elif claim.ticket is not None:
            self.auto.cancel(claim.ticket, now)

    def _parse(self, backend: Backend, outcome: Outcome) -> SpecResult:
        if outcome.body_json is not None:
            return parse_response(backend.kind, outcome.body_json)
        return parse_stream_events(backend.kind, outcome.tail_events)

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

    def observe_cumulative(self, backend: Backend, deltas: list[CounterDelta]) -> None:
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

    def _publish(self, key: SpecKey, transitions: list[Transition]) -> None:
        m = self._metrics
        ratio = self.auto.acceptance(key)
        if ratio is not None:
            m.spec_acceptance_ratio.labels(*key).set(ratio)
        m.spec_enabled.labels(*key).set(1 if self.auto.enabled(key) else 0)
        for t in transitions:
            m.spec_state_changes.labels(*key, t.state, t.reason).inc()
            (log.warning if t.state == "off" else log.info)("%s", t.describe())

    def _release(self, claim: SpecClaim, now: float) -> None:
        if claim.ticket is not None:
            self.auto.cancel(claim.ticket, now)

    def admin_snapshot(self) -> dict[str, Any]:
        now = time.monotonic()
        workloads = self.auto.snapshot(now)
        for row in workloads:  # monotonic instants mean nothing outside this process
            row.pop("since", None)
            if isinstance(row.get("probe"), dict):
                row["probe"].pop("next_at", None)
        backends = [
            {
                "backend": b.name,
                "lane": b.lane,
                "kind": b.kind,
                **speculation_status(
                    kind=b.kind,
                    lane=b.lane,
                    requested=b.speculative_requested,
                    active=b.speculative_active,
                    observed=b.spec_observed,
                    reason=b.spec_reason or b.observed_reason,
                    mode=b.spec_mode,
                ),
            }
            for b in self._pool
        ]
        return {
            "settings": self._settings.model_dump(),
            "workloads": workloads,
            "backends": backends,
        }


def _ran_plain(backend: Backend, result: SpecResult) -> bool:
    """speclane's lane said it decoded without drafting (the client's ``num_draft_tokens: 0``,
    or logits processors): a plain-decoding speed sample, not a speculative one."""
    return (
        backend.lane is not None and isinstance(result, NotReported) and result.reason == "no_draft"
    )


def _with(decision: Decision, candidates: tuple[Candidate, ...]) -> Decision:
    if candidates == decision.candidates:
        return decision
    return dataclasses.replace(decision, candidates=candidates)


def _judged(backend: Backend) -> bool:
    """Speculation requested on it and judged by auto-disable, which needs figures: an
    external backend that cannot report them is left as configured."""
    return backend.speculative_requested and (backend.lane is not None or observable(backend.kind))


def _unobservable(backend: Backend) -> bool:
    return backend.lane is None and backend.speculative_requested and not observable(backend.kind)


def _model_of(outcome: Outcome) -> str | None:
    body = outcome.body_json or (outcome.tail_events[-1] if outcome.tail_events else None)
    model = body.get("model") if isinstance(body, dict) else None
    return model if isinstance(model, str) else None


def _observation(outcome: Outcome) -> Observation | None:
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
