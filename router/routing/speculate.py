"""Whether a request speculates: decided here, and only here (pure, no side effects).

Inputs are the classification's own fields and the workload's auto-disable state as plain
values; the proxy (``router.proxy.telemetry``) reads that state, takes a probe ticket when this
module says the request will speculate, and rewrites the body for plain decoding
(``router.proxy.request``).

Three moments of one decision:

1. While classifying (``advice_rule``, ``lane_speculates``): the workload's state, peeked
   without taking anything, keeps the speculative lane for the request (``spec-lane-free``),
   spends a due probe there (``spec-probe``), or sends it to batching (``spec-not-paying``);
   the speculative lane as a later candidate decodes with its draft only while it pays.
2. Ordering external backends (``paused_last``): a backend configured as speculative whose
   workload is off goes behind the others; it still serves when nothing else can.
3. Settling the first candidate (``settle``) with the verdict the proxy took: off, or a
   baseline sample, means the speculative lane decodes without its draft; an external backend
   has no plain mode, so its ticket is returned; a probe sent to one says so in the decision
   (``probe_decision``).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass

from router.routing.types import BackendView, Candidate, Decision

__all__ = [
    "SPECULATION_PAYS", "Settled", "SpecAdvice", "SpecOracle", "advice_label", "advice_rule",
    "lane_speculates", "paused_last", "probe_decision", "settle", "speculates",
    "speculation_pays",
]


@dataclass(frozen=True, slots=True)
class SpecAdvice:
    """The speculative state for one (model, workload): use it, or probe it while off."""

    use: bool = True
    probe: bool = False


SPECULATION_PAYS = SpecAdvice()
# (model, workload) -> advice. A query without side effects: it is asked on every request,
# and a probe is spent only when the decision says so (``Classification.is_probe``).
SpecOracle = Callable[[str, str], SpecAdvice]


def speculation_pays(model: str, workload: str) -> SpecAdvice:
    return SPECULATION_PAYS


def advice_rule(advice: SpecAdvice) -> str | None:
    """The rule that keeps the request off the speculative lane, or None when it may go."""
    return None if advice.use or advice.probe else "spec-not-paying"


def free_rule(advice: SpecAdvice, predicted: bool = False) -> str:
    """The rule naming a request the speculative lane takes (``prediction``: the request
    brings its own draft, an OpenAI Predicted Output)."""
    if not advice.use and advice.probe:
        return "spec-probe"
    return "prediction" if predicted else "spec-lane-free"


def lane_speculates(view: BackendView, advice: SpecAdvice, predicted: bool = False) -> bool:
    """Whether the speculative lane drafts for this request: with its own draft source, or
    from the request's prediction (even on a lane without a draft model)."""
    return (view.speculative or predicted) and (advice.use or advice.probe)


def advice_label(advice: SpecAdvice) -> str:
    if advice.use:
        return "use"
    return "probe" if advice.probe else "off"


def speculates(lane: str | None, requested: bool, candidate: Candidate) -> bool:
    """Whether serving ``candidate`` runs speculation: the speculative lane as the candidate
    says; an external backend when the user configured it as speculative."""
    if lane == "speculative":
        return candidate.speculative
    return lane is None and requested


def paused_last(candidates: tuple[Candidate, ...],
                paused: Callable[[Candidate], bool]) -> tuple[Candidate, ...]:
    """Candidates whose speculation is off for this workload go behind the others (stable)."""
    if len(candidates) < 2:
        return candidates
    keep = [c for c in candidates if not paused(c)]
    if not keep or len(keep) == len(candidates):
        return candidates
    return (*keep, *(c for c in candidates if paused(c)))


@dataclass(frozen=True, slots=True)
class Settled:
    candidates: tuple[Candidate, ...]
    keep_ticket: bool  # False: the verdict's ticket must be returned unused
    baseline: bool  # the request is a plain-decoding sample to compare speculation against


def settle(candidates: tuple[Candidate, ...], lane: str | None, use: bool, probe: bool,
           baseline_sample: bool) -> Settled:
    """The first candidate speculates (``speculates`` said so); apply the taken verdict."""
    if probe or use:
        return Settled(candidates, True, False)
    first = candidates[0]
    if lane == "speculative":
        # Off (or a baseline sample): the same lane decodes without the draft.
        plain = dataclasses.replace(first, speculative=False)
        return Settled((plain, *candidates[1:]), True, baseline_sample)
    return Settled(candidates, False, False)  # no plain mode out there


def probe_decision(decision: Decision, backend: str) -> Decision:
    """Say in X-Speclane-Decision that this request probes speculation on an external
    backend where it is off (``spec-probe->llamacpp``, not ``external->llamacpp``)."""
    prefix, sep, _ = decision.reason.rpartition(",")
    return dataclasses.replace(decision, reason=f"{prefix}{sep}spec-probe->{backend}",
                               labels={**decision.labels, "rule": "spec-probe"})
