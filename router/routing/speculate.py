"""The routing side of whether a request speculates (pure, no side effects, values in and
out): the draft sources a request may ask for (``request_sources``, a part of the
auto-disable key and what the router asks its lanes for), and the rules the workload's state
makes while classifying.

The state itself is read, and a probe or baseline ticket taken and returned, by the owner of
the router's speculation decision, ``router.proxy.speculation``, which hands it here as
``SpecAdvice`` values:

1. While classifying (``advice_rule``, ``lane_speculates``): the workload's state, peeked
   without taking anything, keeps the speculative lane for the request (``spec-lane-free``),
   spends a due probe there (``spec-probe``), or sends it to batching (``spec-not-paying``);
   the speculative lane as a later candidate decodes with its draft only while it pays.
2. Ordering external backends (``paused_last``): a backend configured as speculative whose
   workload is off goes behind the others; it still serves when nothing else can.
"""

from __future__ import annotations

from dataclasses import dataclass

from router.kernel.worker_contract import REQUEST_DRAFT_SOURCES
from router.routing.types import BackendView, Candidate

__all__ = [
    "SPECULATION_PAYS",
    "SpecAdvice",
    "advice_label",
    "advice_rule",
    "asked_source",
    "batch_request_sources",
    "candidate_source",
    "lane_sources",
    "lane_speculates",
    "paused_last",
    "request_sources",
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


def batch_request_sources(family: str, asked: str | None, configured: str) -> tuple[str, ...]:
    """The sources a request may draft with on the batching lane, in order of preference:
    the free ones of ``request_sources`` (no draft model runs there), each judged by
    auto-disable apart from the same source on the speculative lane. ``draft_model`` asked
    by the client, or configured alone, means no drafting there (``none``)."""
    sources = request_sources(family, asked, configured, lane_has_draft=False)
    return tuple(s for s in sources if s != "draft_model") or ("none",)


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


def paused_last(candidates: tuple[Candidate, ...], paused: frozenset[str]) -> tuple[Candidate, ...]:
    """Candidates whose backend (a name in ``paused``) has speculation off for this workload
    go behind the others (stable)."""
    if len(candidates) < 2 or not paused:
        return candidates
    keep = [c for c in candidates if c.backend not in paused]
    if not keep or len(keep) == len(candidates):
        return candidates
    return (*keep, *(c for c in candidates if c.backend in paused))
