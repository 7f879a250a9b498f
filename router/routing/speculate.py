"""Whether a request speculates, and with which draft source: decided here, and only here
(pure, no side effects). The source (``request_sources``, ``choose_source``) is a part of the
auto-disable key and what the router asks its speculative lane for.

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
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from router.kernel.worker_contract import REQUEST_DRAFT_SOURCES
from router.routing.types import BackendView, Candidate, Decision

__all__ = [
    "SPECULATION_PAYS",
    "Settled",
    "SpecAdvice",
    "SpecOracle",
    "advice_label",
    "advice_rule",
    "asked_source",
    "batch_request_sources",
    "candidate_source",
    "choose_source",
    "lane_source",
    "lane_sources",
    "lane_speculates",
    "paused_last",
    "probe_decision",
    "request_source",
    "request_sources",
    "settle",
    "speculates",
    "speculation_pays",
]

# The draft sources, as the auto-disable state and the metrics name them: on the speculative
# lane ``prediction`` (the request's own), ``draft_model``, ``prompt_lookup`` and ``suffix``
# (the ones a body may ask for, ``LANE_ASKABLE``) or ``none``; an external backend's is its
# draft model.
EXTERNAL_SOURCE = "draft_model"
LANE_ASKABLE = frozenset(REQUEST_DRAFT_SOURCES)


@dataclass(frozen=True, slots=True)
class SpecAdvice:
    """The speculative state for one (model, workload, source): use it, or probe it while
    off."""

    use: bool = True
    probe: bool = False


SPECULATION_PAYS = SpecAdvice()
# (model, workload, source) -> advice. A query without side effects: it is asked on every
# request, and a probe is spent only when the decision says so (``Classification.is_probe``).
SpecOracle = Callable[[str, str, str], SpecAdvice]


def speculation_pays(model: str, workload: str, source: str) -> SpecAdvice:
    return SPECULATION_PAYS


def lane_sources(family: str, configured: str, lane_has_draft: bool) -> tuple[str, ...]:
    """The draft sources the router may ask its speculative lane for (the body's
    ``draft_source``); empty: ask nothing.

    ``configured`` is ``[lanes] draft_source``. ``auto`` asks the lane to choose: the lane
    picks the source, and the length, at every step from what it measures
    (``router.worker.drafting.draftchoice``), so the family says nothing here any more; a
    ``prediction`` request drafts from its prediction among the lane's sources (nothing to
    ask). A fixed value is that source alone for every family; ``draft_model`` without a
    loaded draft model, and ``none``, ask nothing (no drafting)."""
    if family == "prediction":
        return ()
    if configured == "auto":
        return ("auto",)
    if configured == "draft_model":
        return ("draft_model",) if lane_has_draft else ()
    return (configured,) if configured in ("prompt_lookup", "suffix") else ()


def lane_source(family: str, configured: str, lane_has_draft: bool) -> str | None:
    """The source preferred for a family (``lane_sources``' first), or None."""
    sources = lane_sources(family, configured, lane_has_draft)
    return sources[0] if sources else None


def request_sources(
    family: str, asked: str | None, configured: str, lane_has_draft: bool
) -> tuple[str, ...]:
    """The sources a request may draft with on the speculative lane, each a key of the
    auto-disable state and the metrics, in order of preference: its prediction alone, else
    the client's own ``draft_source`` alone (``asked``, forwarded as sent), else
    ``lane_sources``, else ``none``."""
    if family == "prediction":
        return ("prediction",)
    if asked:
        return (asked,)
    return lane_sources(family, configured, lane_has_draft) or ("none",)


def request_source(family: str, asked: str | None, configured: str, lane_has_draft: bool) -> str:
    """The preferred one of ``request_sources``."""
    return request_sources(family, asked, configured, lane_has_draft)[0]


def batch_request_sources(family: str, asked: str | None, configured: str) -> tuple[str, ...]:
    """The sources a request may draft with on the batching lane, in order of preference:
    the free ones of ``request_sources`` (no draft model runs there), each judged by
    auto-disable apart from the same source on the speculative lane. ``draft_model`` asked
    by the client, or configured alone, means no drafting there (``none``)."""
    sources = request_sources(family, asked, configured, lane_has_draft=False)
    return tuple(s for s in sources if s != "draft_model") or ("none",)


def choose_source(
    sources: Sequence[str], advise: Callable[[str], SpecAdvice]
) -> tuple[str, SpecAdvice]:
    """The source a request drafts with, and its state's advice: the first source that is on
    or whose probe is due (so a preferred source that was turned off is still probed on its
    schedule), else the first one (off everywhere: the request decodes plainly). ``sources``
    is never empty."""
    first: tuple[str, SpecAdvice] | None = None
    for source in sources:
        advice = advise(source)
        if advice.use or advice.probe:
            return source, advice
        first = first or (source, advice)
    assert first is not None, "choose_source needs at least one source"
    return first


def asked_source(candidate: Candidate) -> str | None:
    """What the router writes in a lane's ``draft_source`` body field: the candidate's source
    when it is one the lane takes from the body (not ``prediction``, which the body's own
    ``prediction`` says, nor ``none``)."""
    return candidate.source if candidate.source in LANE_ASKABLE else None


def candidate_source(candidate: Candidate) -> str:
    """The key part of a candidate: the lane's request source, an external backend's draft
    model."""
    return candidate.source or EXTERNAL_SOURCE


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
    """Whether serving ``candidate`` runs speculation: either lane as the candidate says; an
    external backend when the user configured it as speculative."""
    if lane is not None:
        return candidate.speculative
    return lane is None and requested


def paused_last(
    candidates: tuple[Candidate, ...], paused: Callable[[Candidate], bool]
) -> tuple[Candidate, ...]:
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


def settle(
    candidates: tuple[Candidate, ...],
    lane: str | None,
    use: bool,
    probe: bool,
    baseline_sample: bool,
) -> Settled:
    """The first candidate speculates (``speculates`` said so); apply the taken verdict."""
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
