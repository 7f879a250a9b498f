"""Whether a free source drafts at this step (pure): speculation that pays, per sequence and
per step.

Verifying ``k`` draft tokens widens a forward pass from 1 to ``1 + k`` positions. Where the
pass is bound by reading the weights (a GPU, one sequence) that is nearly free; on a CPU every
position costs compute, and a draft the target rejects makes the step slower than a plain one.
So each step's length is chosen from two measured figures (Leviathan et al., "Fast Inference
from Transformers via Speculative Decoding", section 3.3):

- ``alpha``, the chance that the target keeps the next draft token, per sequence: a moving
  count of kept and rejected draft tokens (``Acceptance``). While a sequence does not draft,
  its source still proposes (free sources cost no forward pass) and the proposal's first
  token is checked against the token the target then emits (``propose_unverified``,
  ``check``), so a sequence that starts copying text starts drafting again.
- ``beta``, what one more position costs relative to a one-position pass, per lane and batch
  size: measured from the lane's own passes (``PassCost``), or fixed by the setting
  ``[lanes] draft_position_cost``.

A draft of ``k`` yields ``1 + alpha + ... + alpha^k`` tokens on average for a pass costing
``1 + beta * k``; when some ``k`` (up to the source's and the lane's maximum) yields more
tokens per unit of cost than a plain step, the step drafts the maximum (``Pace.length``
says why not the best ``k``), else nothing. Forced tokens (a grammar's) and a draft model's
proposals are not chosen here: the first are nearly always kept, the second cost a draft
pass of their own (auto-disable judges them).
"""

from __future__ import annotations

import statistics
from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass, field

# A sequence's acceptance before it has drafted: one kept and one rejected token; a
# request's ``prediction`` is its client's own statement of the answer (an edit of a text
# it sent), so it starts trusted: four kept to one rejected.
PRIOR = (1.0, 1.0)
PREDICTION_PRIOR = (4.0, 1.0)
# Weight of the older observations at each new one: the last few steps dominate, so a
# sequence that starts (or stops) copying is seen within a few tokens.
ACCEPTANCE_DECAY = 0.7
# Before a lane has measured a pass of each width: a mid-range guess, replaced by the
# median of the last ``COST_SAMPLES`` measurements.
PRIOR_BETA = 0.1
COST_SAMPLES = 15


class Acceptance:
    """One sequence's moving chance that the target keeps its next draft token."""

    __slots__ = ("_shadow", "_shadow_at", "kept", "rejected")

    def __init__(self, prior: tuple[float, float] = PRIOR) -> None:
        self.kept, self.rejected = prior
        self._shadow: int | None = None  # a proposal's first token, not drafted
        self._shadow_at = 0  # the history length it was to follow

    @property
    def alpha(self) -> float:
        return self.kept / (self.kept + self.rejected)

    def observe(self, kept: float, rejected: float) -> None:
        self.kept = self.kept * ACCEPTANCE_DECAY + kept
        self.rejected = self.rejected * ACCEPTANCE_DECAY + rejected

    def verified(self, drafted: int, accepted: int) -> None:
        """A verified draft: ``accepted`` of ``drafted`` tokens kept (the first rejected one
        ends the run; the tokens after it say nothing)."""
        if drafted > 0:
            self.observe(accepted, 1 if accepted < drafted else 0)

    def propose_unverified(self, history_len: int, proposal: list[int]) -> None:
        """What the source proposed after ``history_len`` tokens while the step drafts
        nothing: checked against the next token the target emits (``check``)."""
        self._shadow = proposal[0] if proposal else None
        self._shadow_at = history_len

    def check(self, history: list[int]) -> None:
        """Score a pending shadow proposal once ``history`` holds the token it guessed."""
        if self._shadow is not None and len(history) > self._shadow_at:
            hit = history[self._shadow_at] == self._shadow
            self.observe(1 if hit else 0, 0 if hit else 1)
            self._shadow = None


def expected_tokens(alpha: float, k: int) -> float:
    """Tokens one step emits on average with a draft of ``k``: the target's own token plus
    each draft token while every one before it was kept."""
    return sum(alpha**i for i in range(k + 1))


def best_length(alpha: float, beta: float, most: int) -> int:
    """The draft length in ``0..most`` with the most tokens per unit of pass cost; with free
    positions (``beta`` 0), the longest."""
    if beta <= 0:
        return max(0, most)
    best, best_rate = 0, 1.0
    for k in range(1, max(0, most) + 1):
        rate = expected_tokens(alpha, k) / (1.0 + beta * k)
        if rate > best_rate * 1.0001:  # a tie keeps the shorter (cheaper, surer) draft
            best, best_rate = k, rate
    return best


@dataclass
class _Widths:
    """The last ``COST_SAMPLES`` timings of one batch size; their medians are the figures
    (a busy machine's outliers, a pass that waited on another process, move no median)."""

    plains: deque[float] = field(default_factory=lambda: deque(maxlen=COST_SAMPLES))
    betas: deque[float] = field(default_factory=lambda: deque(maxlen=COST_SAMPLES))

    @property
    def plain(self) -> float | None:
        return statistics.median(self.plains) if self.plains else None

    @property
    def beta(self) -> float | None:
        return statistics.median(self.betas) if self.betas else None


class PassCost:
    """What one more position of a pass costs, relative to a one-position pass, per batch
    size: measured (``fixed`` None) or the setting's figure."""

    def __init__(self, fixed: float | None = None) -> None:
        if fixed is not None and fixed < 0:
            raise ValueError("draft_position_cost must be >= 0")
        self.fixed = fixed
        self._by_rows: dict[int, _Widths] = {}

    def observe(self, rows: int, width: int, seconds: float) -> None:
        """One pass of ``rows`` sequences, ``width`` positions each, took ``seconds``."""
        if seconds <= 0 or width < 1 or rows < 1:
            return
        w = self._by_rows.setdefault(rows, _Widths())
        if width == 1:  # kept with a fixed beta too: a draft model's cost is relative to it
            w.plains.append(seconds)
            return
        plain = w.plain
        if self.fixed is not None or plain is None:
            return  # fixed, or nothing to compare with yet
        w.betas.append(max(0.0, (seconds / plain - 1.0) / (width - 1)))

    def plain(self, rows: int = 1) -> float | None:
        """Seconds of a one-position pass of ``rows`` sequences, once measured."""
        w = self._by_rows.get(rows)
        return None if w is None else w.plain

    def seed_plain(self, rows: int, seconds: float) -> None:
        """A one-position pass timed outside decoding (a calibration), kept until decoding
        measures its own; counted even with a fixed ``beta`` (the draft model's cost is
        relative to it)."""
        w = self._by_rows.setdefault(rows, _Widths())
        if not w.plains and seconds > 0:
            w.plains.append(seconds)

    def needs_plain(self, rows: int) -> bool:
        """Measured, and no one-position pass of ``rows`` sequences timed yet."""
        if self.fixed is not None:
            return False
        w = self._by_rows.get(rows)
        return w is None or w.plain is None

    def beta(self, rows: int = 1) -> float:
        if self.fixed is not None:
            return self.fixed
        w = self._by_rows.get(rows)
        return PRIOR_BETA if w is None or w.beta is None else w.beta

    def report(self) -> Mapping[str, object]:
        """For ``/health``: the figure used per batch size measured."""
        if self.fixed is not None:
            return {"draft_position_cost": self.fixed}
        return {
            "draft_position_cost": {
                str(rows): round(w.beta, 4)
                for rows, w in sorted(self._by_rows.items())
                if w.beta is not None
            }
        }


class Pace:
    """One sequence's draft lengths with a free ``source``: its acceptance, its lane's pass
    cost at ``rows`` sequences."""

    __slots__ = ("acceptance", "cost", "rows")

    def __init__(self, cost: PassCost, source: str | None = None, rows: int = 1) -> None:
        self.acceptance = Acceptance(PREDICTION_PRIOR if source == "prediction" else PRIOR)
        self.cost = cost
        self.rows = rows

    def length(self, history: list[int], most: int) -> int:
        """This step's draft length after ``history``: ``most`` when a draft pays, else 0.
        Not the best length itself: acceptance comes in runs (a copied span is kept whole,
        new text refused at once), which the per-token figure averages away, so a short
        draft would forgo the long runs that make copying pay."""
        self.acceptance.check(history)
        return most if best_length(self.acceptance.alpha, self.cost.beta(self.rows), most) else 0

    def passed(self, width: int, seconds: float, drafted: int, accepted: int) -> None:
        """A pass of ``width`` positions took ``seconds``; ``accepted`` of ``drafted`` kept."""
        self.cost.observe(self.rows, width, seconds)
        self.acceptance.verified(drafted, accepted)
