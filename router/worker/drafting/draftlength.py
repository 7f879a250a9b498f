"""What each sequence of the batching lane drafts with, and how far (pure).

Verifying ``d`` draft tokens widens a sequence's row of the batch's forward pass to ``1 + d``
positions, and every row of the pass is as wide as the widest. One sequence alone leaves most
of a forward pass's cost unused where the pass is bound by reading the weights (a GPU), so a
long draft is nearly free there; a full batch already uses the machine, so every extra
position costs about as much as it can save. So the draft shrinks as the batch grows, down
to none (vLLM's dynamic speculative decoding): ``BATCH_DRAFT_TABLE``, then the source's own
maximum, the request's ``num_draft_tokens`` and the tokens the sequence may still emit lower
it further. Within that, each step drafts only as far as pays for the sequence's acceptance
and the lane's measured cost of a position (``router.worker.drafting.draftcontrol``).

The sources are the free ones (no draft model runs on this lane): the request's
``prediction``, prompt lookup and ``suffix``. A request with logits processors (penalties, a
logit bias) does not draft here.

A constrained request (its decoding constraint its only processor) also drafts its grammar's
forced tokens (``router.worker.drafting.forced``), chained with its source's proposals as on the
speculative lane. Forced runs go up to ``FORCED_MAX_DRAFT`` (the speculative lane's cap) but
follow the table too, at ``FORCED_TABLE_FACTOR`` times its length: a forced token is nearly
always kept where a source's proposal often is not, so the same widening of the batch's pass
buys more output; where the table says none (a large batch, where every position of the pass
is paid for by every row) the pass stays one position wide, forced tokens or not.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from router.worker.drafting.drafts import LookupConfig, PredictionConfig
from router.worker.drafting.forced import FORCED_MAX_DRAFT
from router.worker.drafting.suffix import SuffixConfig
from router.worker.request.protocol import GenerationRequest

# (largest batch size, draft tokens per sequence per step); larger batches draft nothing.
BATCH_DRAFT_TABLE: tuple[tuple[int, int], ...] = ((2, 8), (4, 6), (8, 2))

AUTO_SOURCES = ("prompt_lookup", "suffix")  # ``auto``'s sources here, after a prediction

# A forced run's length per batch size, in the table's lengths (see the module's docstring).
FORCED_TABLE_FACTOR = 2


def batch_draft_length(
    batch_size: int, table: tuple[tuple[int, int], ...] = BATCH_DRAFT_TABLE
) -> int:
    """Draft tokens per sequence for a step of ``batch_size`` decoding sequences."""
    for largest, length in table:
        if batch_size <= largest:
            return length
    return 0


def sequence_draft_length(batch_size: int, source_max: int, room: int) -> int:
    """One sequence's draft this step: the table's length for the batch, at most its
    ``source_max`` (the source's maximum, lowered by the request's ``num_draft_tokens``) and
    ``room - 1`` (the pending token is emitted too, and ``room`` is what it may still emit)."""
    return max(0, min(batch_draft_length(batch_size), source_max, room - 1))


def forced_draft_length(batch_size: int, forced_max: int, room: int) -> int:
    """How many forced tokens one constrained sequence may draft this step: the table's
    length for the batch times ``FORCED_TABLE_FACTOR``, at most ``forced_max`` (its plan's:
    ``FORCED_MAX_DRAFT``, lowered by the request's ``num_draft_tokens``) and ``room - 1``."""
    scaled = FORCED_TABLE_FACTOR * batch_draft_length(batch_size)
    return max(0, min(scaled, forced_max, room - 1))


@dataclass(frozen=True)
class BatchDraftSettings:
    """The batching lane's draft sources: their limits, and the lane's own source for
    requests that name none (``none``: only a prediction or a request's ``draft_source``
    drafts; the router names one per request)."""

    draft_source: str = "none"
    lookup: LookupConfig = field(default_factory=LookupConfig)
    prediction: PredictionConfig = field(default_factory=PredictionConfig)
    suffix: SuffixConfig = field(default_factory=SuffixConfig)
    # A free source's draft length per step: None measures what a position costs.
    draft_position_cost: float | None = None


@dataclass(frozen=True)
class BatchPlan:
    source: str | None  # None: no source (forced tokens only, or plain decoding)
    k: int = 0  # the most the source drafts per step, before the table
    forced: int = 0  # a constrained request: the most forced tokens per step, before the table

    @property
    def drafts(self) -> bool:
        return self.source is not None or self.forced > 0


PLAIN = BatchPlan(None)


def batch_plan(
    request: GenerationRequest,
    settings: BatchDraftSettings,
    has_processors: bool,
    constrained: bool = False,
) -> BatchPlan:
    """Which source a request drafts with on the batching lane: its prediction, else its own
    ``draft_source``, else the lane's; plus the forced tokens of a ``constrained`` one (its
    constraint not counted in ``has_processors``). Plain with other logits processors,
    ``num_draft_tokens: 0``, or no source this lane has (``draft_model``) and no constraint."""
    asked = request.num_draft_tokens
    if has_processors or asked == 0:
        return PLAIN

    def capped(k: int) -> int:
        return k if asked is None else min(asked, k)

    forced = capped(FORCED_MAX_DRAFT) if constrained else 0
    source = request.draft_source or settings.draft_source
    if source == "auto":
        k = max(settings.lookup.max_draft, settings.suffix.max_draft)
        if request.prediction:
            k = max(k, settings.prediction.max_draft)
    elif request.prediction:
        source, k = "prediction", settings.prediction.max_draft
    else:
        if source == "prompt_lookup":
            k = settings.lookup.max_draft
        elif source == "suffix":
            k = settings.suffix.max_draft
        else:
            return BatchPlan(None, 0, forced)
    return BatchPlan(source, capped(k), forced)
