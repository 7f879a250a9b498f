"""The two measured figures a draft's worth is judged by (pure), per sequence and per lane.

Verifying ``k`` draft tokens widens a forward pass from 1 to ``1 + k`` positions. Where the
pass is bound by reading the weights (a GPU, one sequence) that is nearly free; on a CPU every
position costs compute, and a draft the target rejects makes the step slower than a plain one.
So each step's draft is judged (``router.worker.drafting.draftchoice``; Leviathan et al., "Fast
Inference from Transformers via Speculative Decoding", section 3.3) from:

- ``alpha``, the chance that the target keeps the next draft token, per sequence and source:
  a moving count of kept and rejected draft tokens (``Acceptance``);
- the cost of a pass by its width relative to a one-position pass, per lane, batch size and
  BLAS thread count (``CostProfile``: a step paid once wider, then ``beta`` per position):
  measured from the lane's own passes (``PassCost``), or fixed by the setting
  ``[lanes] draft_position_cost`` (``beta`` alone).
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
# The per-position counts fade slower than the overall figure (each position sees fewer
# drafts), are kept for this many positions, and weigh the overall figure as one draft.
RUN_DECAY = 0.9
MAX_POSITIONS = 32
POSITION_PRIOR_WEIGHT = 1.0


class Acceptance:
    """One sequence's moving chance that the target keeps its next draft token, overall
    (``alpha``) and by position in the draft (``expected``)."""

    __slots__ = ("_reached", "_refused", "kept", "rejected")

    def __init__(self, prior: tuple[float, float] = PRIOR) -> None:
        self.kept, self.rejected = prior
        # Per draft position: the (decayed) drafts that reached it, and those refused there.
        self._reached: list[float] = []
        self._refused: list[float] = []

    @property
    def alpha(self) -> float:
        return self.kept / (self.kept + self.rejected)

    def observe(self, kept: float, rejected: float) -> None:
        self.kept = self.kept * ACCEPTANCE_DECAY + kept
        self.rejected = self.rejected * ACCEPTANCE_DECAY + rejected
        reached = int(kept) + (1 if rejected else 0)
        if len(self._reached) < reached:
            grow = min(reached, MAX_POSITIONS) - len(self._reached)
            self._reached += [0.0] * grow
            self._refused += [0.0] * grow
        for i in range(len(self._reached)):
            self._reached[i] *= RUN_DECAY
            self._refused[i] *= RUN_DECAY
            if i < reached:
                self._reached[i] += 1.0
        if rejected and int(kept) < len(self._refused):
            self._refused[int(kept)] += 1.0

    def verified(self, drafted: int, accepted: int) -> None:
        """A verified draft: ``accepted`` of ``drafted`` tokens kept (the first rejected one
        ends the run; the tokens after it say nothing)."""
        if drafted > 0:
            self.observe(accepted, 1 if accepted < drafted else 0)

    def expected(self, k: int) -> float:
        """Tokens one step emits on average with a draft of ``k``: the target's own token
        plus each draft token while every one before it was kept. Acceptance comes in runs
        (a copied span is kept whole, new text refused at once), so the chance of passing
        each position is measured per position, each drawn towards the overall figure
        while few drafts reached it."""
        return self.expected_upto(k)[k]

    def expected_upto(self, most: int) -> list[float]:
        """``expected(k)`` for every ``k`` in ``0..most``, in one pass."""
        overall = 1.0 - self.alpha
        survive, total = 1.0, 1.0
        out = [1.0]
        reached, refused_at = self._reached, self._refused
        for i in range(most):
            if i < len(reached):
                refused = (refused_at[i] + overall * POSITION_PRIOR_WEIGHT) / (
                    reached[i] + POSITION_PRIOR_WEIGHT
                )
            else:
                refused = overall
            survive *= 1.0 - refused
            total += survive
            out.append(total)
        return out


@dataclass(frozen=True)
class CostProfile:
    """What a pass with ``k`` draft positions costs relative to a one-position pass:
    ``1 + jump + beta * k``. A wider pass leaves the one-position kernels (on a CPU the
    attention's, notably), a step paid once whatever the width, then each position costs
    about alike; one figure per position would overprice long drafts and underprice short
    ones."""

    beta: float
    jump: float = 0.0

    def of(self, k: int) -> float:
        return 1.0 if k <= 0 else 1.0 + self.jump + self.beta * k

    @property
    def free(self) -> bool:
        return self.beta <= 0 and self.jump <= 0


def fit(points: Mapping[int, tuple[float, int]]) -> CostProfile | None:
    """The profile through the median relative cost of each measured draft length (``k`` ->
    (median of ``cost - 1``, samples)), least squares weighted by samples; one length
    measured: a cost per position alone."""
    if not points:
        return None
    if len(points) == 1:
        ((k, (y, _)),) = points.items()
        return CostProfile(max(0.0, y / k))
    total = sum(n for _, n in points.values())
    mean_k = sum(k * n for k, (_, n) in points.items()) / total
    mean_y = sum(y * n for y, n in points.values()) / total
    var = sum(n * (k - mean_k) ** 2 for k, (_, n) in points.items())
    cov = sum(n * (k - mean_k) * (y - mean_y) for k, (y, n) in points.items())
    beta = cov / var
    jump = mean_y - beta * mean_k
    if beta < 0:
        return CostProfile(0.0, max(0.0, mean_y))
    if jump < 0:  # through the origin
        squares = sum(n * k * k for k, (_, n) in points.items())
        return CostProfile(max(0.0, sum(n * k * y for k, (y, n) in points.items()) / squares))
    return CostProfile(beta, jump)


@dataclass
class _Widths:
    """The last ``COST_SAMPLES`` timings of one batch size, per width; their medians are the
    figures (a busy machine's outliers, a pass that waited on another process, move no
    median)."""

    plains: deque[float] = field(default_factory=lambda: deque(maxlen=COST_SAMPLES))
    # draft positions -> the last relative costs minus one of passes that wide
    extras: dict[int, deque[float]] = field(default_factory=dict)
    _profile: CostProfile | None = None
    _stale: bool = False

    @property
    def plain(self) -> float | None:
        return statistics.median(self.plains) if self.plains else None

    def add(self, k: int, extra: float) -> None:
        self.extras.setdefault(k, deque(maxlen=COST_SAMPLES)).append(extra)
        self._stale = True

    @property
    def profile(self) -> CostProfile | None:
        if self._stale:
            points = {k: (statistics.median(d), len(d)) for k, d in self.extras.items()}
            self._profile, self._stale = fit(points), False
        return self._profile


class PassCost:
    """What one more position of a pass costs, relative to a one-position pass, per batch
    size: measured (``fixed`` None) or the setting's figure.

    Measured per BLAS thread count too (``threads``, set by the lane before each step where
    it shares the cores with the other lane, ``router.worker.engines.cores``): a pass on one
    thread is dearer per position than on two, relative to a one-position pass of its own
    count, so a figure that mixed the two would misprice both. A count not measured yet
    borrows another count's figure for the same batch size until its own passes are timed."""

    def __init__(self, fixed: float | None = None) -> None:
        if fixed is not None and fixed < 0:
            raise ValueError("draft_position_cost must be >= 0")
        self.fixed = fixed
        self.threads = 0  # the lane's BLAS threads now; 0: not shared, one figure
        self._by_rows: dict[tuple[int, int], _Widths] = {}

    def _others(self, rows: int) -> list[_Widths]:
        return [w for (r, t), w in self._by_rows.items() if r == rows and t != self.threads]

    def observe(self, rows: int, width: int, seconds: float) -> None:
        """One pass of ``rows`` sequences, ``width`` positions each, took ``seconds``."""
        if seconds <= 0 or width < 1 or rows < 1:
            return
        w = self._by_rows.setdefault((rows, self.threads), _Widths())
        if width == 1:  # kept with a fixed beta too: a draft model's cost is relative to it
            w.plains.append(seconds)
            return
        plain = w.plain
        if self.fixed is not None or plain is None:
            return  # fixed, or nothing to compare with yet
        w.add(width - 1, max(0.0, seconds / plain - 1.0))

    def plain(self, rows: int = 1) -> float | None:
        """Seconds of a one-position pass of ``rows`` sequences, once measured (at this
        thread count, else at another)."""
        w = self._by_rows.get((rows, self.threads))
        if w is not None and w.plain is not None:
            return w.plain
        return next((o.plain for o in self._others(rows) if o.plain is not None), None)

    def seed_plain(self, rows: int, seconds: float) -> None:
        """A one-position pass timed outside decoding (a calibration), kept until decoding
        measures its own; counted even with a fixed ``beta`` (the draft model's cost is
        relative to it)."""
        w = self._by_rows.setdefault((rows, self.threads), _Widths())
        if not w.plains and seconds > 0:
            w.plains.append(seconds)

    def needs_plain(self, rows: int) -> bool:
        """Measured, and no one-position pass of ``rows`` sequences timed yet at this
        thread count."""
        if self.fixed is not None:
            return False
        w = self._by_rows.get((rows, self.threads))
        return w is None or w.plain is None

    def profile(self, rows: int = 1) -> CostProfile:
        """The cost of a pass of ``rows`` sequences by its draft positions: measured (at
        this thread count, else at another), the setting's (a cost per position alone), or
        the prior until measured."""
        if self.fixed is not None:
            return CostProfile(self.fixed)
        w = self._by_rows.get((rows, self.threads))
        measured = None if w is None else w.profile
        if measured is None:
            measured = next((p for o in self._others(rows) if (p := o.profile)), None)
        return CostProfile(PRIOR_BETA) if measured is None else measured

    def beta(self, rows: int = 1) -> float:
        return self.profile(rows).beta

    def report(self) -> Mapping[str, object]:
        """For ``/health``: the figure used now per batch size measured (at the lane's
        thread count now, or the one it borrows)."""
        if self.fixed is not None:
            return {"draft_position_cost": self.fixed}
        measured = {
            rows: self.profile(rows)
            for rows in sorted({r for r, _ in self._by_rows})
            if any(w.profile is not None for (r, _), w in self._by_rows.items() if r == rows)
        }
        return {
            "draft_position_cost": {str(r): round(p.beta, 4) for r, p in measured.items()},
            "draft_pass_jump": {str(r): round(p.jump, 4) for r, p in measured.items()},
        }
