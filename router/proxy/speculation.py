"""The router's speculation decision, owned here: what auto-disable, its probes and the
family table say for one request, in the three moments of the pipeline.

1. ``advise(resolved)``, between ``routing.classify.resolve`` and ``route``: the workload's
   state for each source the request may draft with, peeked (nothing is taken), handed to
   routing as values (``Advised``).
2. ``claim(result)``, after routing: external backends whose workload is off go behind the
   others; when the first candidate speculates its key's verdict is taken for real, so a
   probe (or a baseline sample, which runs on the same lane with ``num_draft_tokens: 0``)
   goes to exactly this request, and the candidate is settled (``settle``). The request
   carries its ``SpecClaim`` (key and ticket) to the end.
3. ``complete(outcome, claim, result)``, after the answer: the statistics the answer
   reported (parsed and counted for Prometheus by ``router.proxy.observe.SpecCounts``) feed
   the auto-disable windows (speculative runs) or the baseline (plain runs), or the ticket is
   returned; every state change is logged and counted once.

What drafts at each step, and how far, is the lane's choice, not the router's
(``router.worker.drafting.draftchoice``): the router allows a source or decodes plainly.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from router.backends.base import Backend
from router.backends.pool import BackendPool
from router.backends.status import speculation_of
from router.config.policies import PolicySet
from router.config.settings import Settings
from router.config.speculation import SpecSettings
from router.metrics import Metrics
from router.proxy.observe import Seen, model_of, unobservable
from router.proxy.outcome import Outcome
from router.routing.classify import Advised, Classification, Resolved
from router.routing.speculate import SpecAdvice, candidate_source, paused_last
from router.routing.types import Candidate, Decision
from router.speculation.autodisable import AutoDisable, Transition
from router.speculation.keystate import SpecKey
from router.speculation.observed import observable
from router.speculation.record import NotReported, SpecResult

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

    def names(self, outcome: Outcome) -> tuple[str, str]:
        """The (model, workload) the request is judged and counted under: as classified, or
        (never classified) the model its answer names."""
        return self.model or model_of(outcome) or "unknown", self.workload or "unclassified"


class Speculation:
    def __init__(
        self,
        settings: Settings,
        metrics: Metrics,
        pool: BackendPool,
        policies: Callable[[], PolicySet],
    ) -> None:
        self._settings = settings.spec
        self._metrics = metrics
        self._pool = pool
        self._policies = policies  # the current PolicySet
        self.auto = AutoDisable(settings.spec, resolve=self._resolve)

    def _resolve(self, key: SpecKey) -> SpecSettings:
        policy = self._policies().get(key.workload.split(":", 1)[0])
        return self._settings.merged(policy.spec if policy else None)

    def policies_reloaded(self, ok: bool) -> None:
        """A policy's ``[spec]`` overrides reach the workloads that already have a state
        (windows resized, states kept); new workloads read them anyway."""
        if ok:
            self.auto.reconfigure(self._settings, resolve=self._resolve)

    # --- 1. advise ---------------------------------------------------------------------

    def advise(self, resolved: Resolved) -> Advised:
        """Each lane's source and its state, peeked (nothing is taken)."""
        now = time.monotonic()
        model, workload = resolved.model, resolved.workload
        source, advice = self._choose("speculative", model, workload, resolved.spec_sources, now)
        batch = None
        if (sources := resolved.batch_sources) is not None:
            batch = self._choose("batching", model, workload, sources, now)
        return Advised(source, advice, batch)

    def _choose(
        self, lane: str, model: str, workload: str, sources: tuple[str, ...], now: float
    ) -> tuple[str, SpecAdvice]:
        """The source a request drafts with on ``lane``, and its state's advice: the first
        of ``sources`` (in order of preference, never empty) that is on or whose probe is due
        (so a preferred source that was turned off is still probed on its schedule), else
        the first one (off everywhere: the request decodes plainly). No source after the one
        chosen is peeked."""
        first: tuple[str, SpecAdvice] | None = None
        for source in sources:
            verdict = self.auto.peek(SpecKey(lane, model, workload, source), now)
            if verdict.use_speculation or verdict.probe:
                return source, SpecAdvice(not verdict.probe, verdict.probe)
            first = first or (source, SpecAdvice(False, False))
        assert first is not None, "a lane always has a source to judge"
        return first

    # --- 2. claim ----------------------------------------------------------------------

    def claim(self, result: Classification) -> tuple[Classification, SpecClaim]:
        """The classification as it will be relayed, and what this request was told: the
        verdict is taken for the first candidate when it speculates."""
        decision = result.decision
        claim = SpecClaim(result.model, result.workload)
        now = time.monotonic()
        candidates = decision.candidates
        if len(candidates) > 1:  # a backend whose workload is off goes behind the others
            candidates = paused_last(candidates, self._paused(candidates, claim, now))
        first = candidates[0]
        backend = self._pool[first.backend]
        if speculates(backend.lane, _judged(backend), first):
            # Whose state: a lane of ours by its lane name (the model is its own part of the
            # key, so a model loaded on demand finds its state), an external backend by name.
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
            candidates = settled.candidates
        if candidates != decision.candidates:
            decision = dataclasses.replace(decision, candidates=candidates)
        if decision is not result.decision:
            result = dataclasses.replace(result, decision=decision)
        return result, claim

    def _paused(
        self, candidates: tuple[Candidate, ...], claim: SpecClaim, now: float
    ) -> frozenset[str]:
        """The external backends configured as speculative whose workload is off."""
        paused = []
        for c in candidates:
            b = self._pool[c.backend]
            if b.lane is None and _judged(b):
                key = SpecKey(b.name, claim.model, claim.workload, candidate_source(c))
                if not self.auto.peek(key, now).use_speculation:
                    paused.append(b.name)
        return frozenset(paused)

    # --- 3. complete -------------------------------------------------------------------

    def complete(self, outcome: Outcome, claim: SpecClaim, seen: Seen | None) -> None:
        """The request ended; ``seen``: what its answer reported (``SpecCounts.answer``),
        None when it did not complete (an error, the client gone): its ticket, if any, is
        returned."""
        backend, served = outcome.backend, outcome.candidate
        now = time.monotonic()
        if seen is None or backend is None or served is None:
            self._release(claim, now)
            return
        result, observation = seen
        model, workload = claim.names(outcome)
        key = SpecKey(backend.lane or backend.name, model, workload, candidate_source(served))
        if claim.key is not None and claim.key != key:
            self._release(claim, now)  # a retry moved it to another backend
            claim.ticket = None
        if speculates(backend.lane, _judged(backend), served) and not _ran_plain(backend, result):
            transitions = self.auto.record(key, result, observation, now, claim.ticket)
            self._publish(key, transitions)
        elif unobservable(backend):
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
                **speculation_of(b),
            }
            for b in self._pool
        ]
        return {
            "settings": self._settings.model_dump(),
            "workloads": workloads,
            "backends": backends,
        }


# --- the claim's rules (pure) -------------------------------------------------------------


def speculates(lane: str | None, requested: bool, candidate: Candidate) -> bool:
    """Whether serving ``candidate`` runs speculation: either lane as the candidate says; an
    external backend when the user configured it as speculative."""
    if lane is not None:
        return candidate.speculative
    return requested


@dataclass(frozen=True, slots=True)
class Settled:
    candidates: tuple[Candidate, ...]
    keep_ticket: bool  # False: the verdict's ticket must be returned unused
    baseline: bool  # the request is a plain-decoding sample to compare speculation against


def settle(
    candidates: tuple[Candidate, ...],
    lane: str | None,
    use: bool,
    probe: bool,
    baseline_sample: bool,
) -> Settled:
    """The first candidate speculates (``speculates`` said so); apply the taken verdict: off,
    or a baseline sample, means the lane decodes without drafting; an external backend has no
    plain mode, so its ticket is returned."""
    if probe or use:
        return Settled(candidates, True, False)
    first = candidates[0]
    if lane is not None:
        # Off (or a baseline sample): the same lane decodes without the draft.
        plain = dataclasses.replace(first, speculative=False)
        return Settled((plain, *candidates[1:]), True, baseline_sample)
    return Settled(candidates, False, False)  # no plain mode out there


def probe_decision(decision: Decision, backend: str) -> Decision:
    """Say in X-Speclane-Decision that this request probes speculation on an external
    backend where it is off (``spec-probe->llamacpp``, not ``external->llamacpp``)."""
    prefix, sep, _ = decision.reason.rpartition(",")
    return dataclasses.replace(
        decision,
        reason=f"{prefix}{sep}spec-probe->{backend}",
        labels={**decision.labels, "rule": "spec-probe"},
    )


def _ran_plain(backend: Backend, result: SpecResult) -> bool:
    """speclane's lane said it decoded without drafting (the client's ``num_draft_tokens: 0``,
    or logits processors): a plain-decoding speed sample, not a speculative one."""
    return (
        backend.lane is not None and isinstance(result, NotReported) and result.reason == "no_draft"
    )


def _judged(backend: Backend) -> bool:
    """Speculation requested on it and judged by auto-disable, which needs figures: an
    external backend that cannot report them is left as configured."""
    return backend.speculative_requested and (backend.lane is not None or observable(backend.kind))
