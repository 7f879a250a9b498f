"""Which draft source drafts at this step, and how far (pure): the lane's side of the
speculation decision.

The router decides the lane and whether a request may speculate at all; the lane decides, at
every step of every sequence, which of the sources available to it drafts, or none. The
candidates are the request's ``prediction``, prompt lookup over the whole context, the
client's ``suffix`` index and the lane's draft model (the grammar's forced tokens are chained
in by ``router.worker.drafting.forced`` on top of what this module picks). Each step:

- every free source (no forward pass of its own) proposes; a proposal that is not drafted
  is kept as a *shadow* and scored against the tokens the target then emits, so every free
  source's acceptance stays current whichever one drafts (``Acceptance``, per sequence);
- each source's yield is the expected tokens per unit of cost of its draft: the target's
  token plus each draft position's measured chance to be reached and kept
  (``Acceptance.expected``: acceptance comes in runs, so it is kept per position, and for a
  copying source per class of match length, ``grade_class``) for a pass of
  ``1 + jump + beta * k`` (``router.worker.drafting.draftcontrol.CostProfile``); a draft
  model's proposal costs ``gamma * (k + 1)`` more, ``gamma`` its measured pass time relative
  to the target's (``DraftCost``), so a draft as slow as the target never drafts, and a small
  one drafts while its acceptance pays (SmartSpec, arXiv 2406.14066, per step; chosen here
  between sources as well as lengths);
- the source with the highest yield drafts, as far as the length that yields most; if none
  beats a plain step, the step is plain. In a batched pass the width is the batch's
  decision, not a row's (``batch_width``): a wider pass costs every row, so the width is the
  one that yields most tokens per unit of the pass's cost summed over the rows, each row
  drafting its proposal up to it (``Chooser.curve``, ``Chooser.resize``): a row's medium
  acceptance that pays alone does not pay for a pass its neighbours wait on, and a long
  copy widens the pass for the rows beside it at no cost to them. A free source's run that
  ends short of the step's room is continued by the draft model where that pays on its own
  (copy while the context matches, then predict). A draft model that could pay but has not
  been tried for ``PROBE_EVERY`` steps drafts once (its acceptance is only learnt by
  drafting).

What a client's earlier requests taught carries to its next one (``Evidence``): each
source's acceptance per client partition, so a turn that copies starts from the last turn's
figure instead of a prior.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from router.worker.drafting.draftcontrol import (
    PREDICTION_PRIOR,
    PRIOR,
    Acceptance,
    CostProfile,
    PassCost,
)

CERTAIN = Acceptance((1.0, 0.0))  # every draft token kept: whether a draft can pay at all

Propose = Callable[[list[int], int], list[int]]  # (history, k) -> draft tokens
# How strong the last proposal's evidence was: the length of the context match it copies
# (a source that matches nothing has no grade).
Grade = Callable[[], int]

DRAFT_MODEL = "draft_model"
# Steps without drafting after which a draft model that could pay is tried once.
PROBE_EVERY = 32
# A draft model's pass time relative to the target's, moving average weight of a new figure.
GAMMA_WEIGHT = 0.3
# A proposal fed to the draft model longer than this was a catch-up prefill, not a step.
GAMMA_MAX_FEED = 8
# Carried evidence is weighed down to this many observations, so a new request can
# still overrule what earlier ones taught within a few steps.
CARRY_WEIGHT = 3.0
EVIDENCE_PARTITIONS = 1024  # partitions remembered per lane (least recently used dropped)
# A grade's own acceptance starts from the source's, weighed as this many observations.
GRADE_START_WEIGHT = 2.0
# A longer draft is taken only if it yields this much more than the shorter one.
RATE_MARGIN = 1.0001


def grade_class(match: int) -> int:
    """The class of a match length whose acceptance is kept apart: 2-3, 4-7, 8-15, 16 and
    more tokens (a copied span's continuation is likelier the longer the span already
    matched: SuffixDecoding, arXiv 2411.04975, drafts by match length for this reason)."""
    return min(max(match, 1), 16).bit_length()


Cost = CostProfile | float  # a profile, or a cost per position alone


def _profile(cost: Cost) -> CostProfile:
    return cost if isinstance(cost, CostProfile) else CostProfile(cost)


def yield_rate(acceptance: Acceptance, k: int, cost: Cost, extra: float = 0.0) -> float:
    """Expected tokens per unit of cost for a draft of ``k``: ``extra`` is what proposing it
    costs, in one-position passes of the target."""
    return acceptance.expected(k) / (_profile(cost).of(k) + extra)


def paying(
    acceptance: Acceptance, cost: Cost, most: int, extra_per_token: float = 0.0
) -> tuple[int, float]:
    """(the draft length in ``1..most`` that yields the most per unit of cost, 0 when none
    beats a plain step; its ``yield_rate``, 1.0 for plain decoding)."""
    profile = _profile(cost)
    if profile.free and not extra_per_token and most > 0:
        # Free positions (``draft_position_cost = 0``): a draft costs nothing, the longest.
        return most, max(yield_rate(acceptance, most, profile), 1.001)
    length, best = 0, 1.0
    expected = acceptance.expected_upto(most)
    for k in range(1, most + 1):
        extra = extra_per_token * (k + 1) if extra_per_token else 0.0
        rate = expected[k] / (profile.of(k) + extra)  # ``yield_rate``, the figures at hand
        if rate > best * RATE_MARGIN:
            length, best = k, rate
    return length, best


def best_rate(acceptance: Acceptance, cost: Cost, most: int, extra_per_token: float = 0.0) -> float:
    """The best ``yield_rate`` over draft lengths ``1..most`` (1.0: plain decoding)."""
    return paying(acceptance, cost, most, extra_per_token)[1]


def batch_width(
    curves: Sequence[Sequence[float]], cost: Cost, settled: float = 0.0, floor: int = 0
) -> int:
    """The draft positions of a batched pass that yield the most tokens per unit of the
    pass's cost, summed over its rows: the pass is as wide as its widest row and every row
    waits for it, so a width pays only if what all rows emit grows faster than the pass's
    cost. ``curves``: each sizable row's ``Chooser.curve`` (it drafts ``min(width, n)``);
    ``settled``: the tokens the other rows emit whatever the width (1 a plain row, a fixed
    draft's own), ``floor``: the width their drafts need."""
    profile = _profile(cost)
    widest = max((len(c) - 1 for c in curves), default=0)
    if widest <= floor:
        return floor
    if profile.free:
        return widest

    def emitted(width: int) -> float:
        return settled + sum(c[min(width, len(c) - 1)] for c in curves)

    width, best = floor, emitted(floor) / profile.of(floor)
    for w in range(floor + 1, widest + 1):
        rate = emitted(w) / profile.of(w)
        if rate > best * RATE_MARGIN:
            width, best = w, rate
    return width


class DraftCost:
    """A draft model's pass time relative to a one-position pass of the target (``gamma``),
    per lane: measured from its proposals, or fixed."""

    def __init__(self, fixed: float | None = None) -> None:
        self.gamma: float | None = fixed
        self.fixed = fixed is not None

    def observe(self, passes: int, seconds: float, plain_seconds: float | None) -> None:
        """A proposal of ``passes`` draft passes took ``seconds``; the target's one-position
        pass takes ``plain_seconds`` (None: not measured yet)."""
        if self.fixed or passes < 1 or seconds <= 0 or not plain_seconds:
            return
        gamma = seconds / passes / plain_seconds
        self.gamma = (
            gamma if self.gamma is None else self.gamma + GAMMA_WEIGHT * (gamma - self.gamma)
        )

    def report(self) -> Mapping[str, object]:
        return {"draft_model_cost": None if self.gamma is None else round(self.gamma, 4)}


@dataclass
class _Shadow:
    at: int  # the history length the proposal was to follow
    tokens: list[int]
    grade: int | None = None

    def score(self, history: list[int]) -> tuple[int, int] | None:
        """(kept, rejected) once ``history`` settles the proposal, else None."""
        emitted = history[self.at : self.at + len(self.tokens)]
        kept = 0
        while kept < len(emitted) and emitted[kept] == self.tokens[kept]:
            kept += 1
        if kept < len(emitted):
            return kept, 1
        return (kept, 0) if kept == len(self.tokens) else None


@dataclass
class DraftCandidate:
    """One source of one sequence: how it proposes, its most per step, its acceptance."""

    name: str
    propose: Propose
    most: int
    acceptance: Acceptance = field(default_factory=Acceptance)
    shadow: _Shadow | None = None
    idle: int = 0  # steps since it last drafted (a draft model's probe)
    grade: Grade | None = None  # the last proposal's match length (a copying source)
    # Acceptance per match-length class: a two-token match and a sixteen-token one copy
    # with very different odds, which one figure per source averages away.
    graded: dict[int, Acceptance] = field(default_factory=dict)

    @property
    def is_model(self) -> bool:
        return self.name == DRAFT_MODEL

    def last_grade(self) -> int | None:
        return None if self.grade is None else grade_class(self.grade())

    def acceptance_for(self, grade: int | None) -> Acceptance:
        """The acceptance that judges a proposal of ``grade``: its class's own, started
        from the source's figure when the class is new."""
        if grade is None:
            return self.acceptance
        found = self.graded.get(grade)
        if found is None:
            alpha = self.acceptance.alpha
            start = (alpha * GRADE_START_WEIGHT, (1.0 - alpha) * GRADE_START_WEIGHT)
            found = self.graded[grade] = Acceptance(start)
        return found

    def observe(self, grade: int | None, kept: float, rejected: float) -> None:
        self.acceptance.observe(kept, rejected)
        if grade is not None:
            self.acceptance_for(grade).observe(kept, rejected)


@dataclass(frozen=True)
class Choice:
    source: str | None  # None: a plain step
    tokens: list[int]
    # A free source's run continued by the draft model: its tokens from ``chained`` on.
    chained: int | None = None
    grade: int | None = None  # the drafting source's match-length class

    def parts(self) -> list[tuple[str, int, int]]:
        """(source, first, end) of each source's tokens in the draft."""
        if self.source is None:
            return []
        if self.chained is None:
            return [(self.source, 0, len(self.tokens))]
        return [(self.source, 0, self.chained), (DRAFT_MODEL, self.chained, len(self.tokens))]


PLAIN = Choice(None, [])


@dataclass
class Tally:
    """What one source drafted for one sequence (the usage's ``sources``)."""

    drafted: int = 0
    accepted: int = 0
    steps: int = 0


class Chooser:
    """One sequence's draft at every step, from its ``candidates`` (in order of preference
    on a tie). ``paced`` False: the first source with a proposal drafts its most, always (a
    source a client named, or a test)."""

    def __init__(
        self,
        candidates: Iterable[DraftCandidate],
        cost: PassCost,
        draft_cost: DraftCost | None = None,
        *,
        paced: bool = True,
        rows: int = 1,
    ) -> None:
        self.candidates = [c for c in candidates if c.most > 0]
        self.cost = cost
        self.draft_cost = draft_cost or DraftCost()
        self.paced = paced
        self.rows = rows
        self.tallies: dict[str, Tally] = {}
        self.plain_steps = 0  # steps that drafted nothing although a source proposed
        # This step's free proposals, what drafts, and the cost it was judged by: what
        # ``curve`` prices and ``resize`` drafts on (a batched pass's width).
        self._step: tuple[list[_Proposal], DraftCandidate | None, CostProfile] | None = None
        self._at = 0  # the history length this step's proposals follow

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(c.name for c in self.candidates)

    def _settle_shadows(self, history: list[int]) -> None:
        for c in self.candidates:
            if c.shadow is not None and (scored := c.shadow.score(history)) is not None:
                c.observe(c.shadow.grade, *scored)
                c.shadow = None

    def _model_extra(self) -> float | None:
        """A draft model's cost per proposed token in target passes; None: unknown yet."""
        return self.draft_cost.gamma

    def choose(self, history: list[int], room: int) -> Choice:
        """This step's draft after ``history``: at most ``room`` tokens."""
        self._step = None
        if room <= 0 or not self.candidates:
            return PLAIN
        self._settle_shadows(history)
        self._at = len(history)
        if not self.paced:
            return self._first(history, room)
        beta = self.cost.profile(self.rows)
        best: DraftCandidate | None = None
        best_tokens: list[int] = []
        best_yield = 1.0
        best_grade: int | None = None
        proposals: list[_Proposal] = []
        model: DraftCandidate | None = None
        model_pays = False
        for c in self.candidates:
            c.idle += 1
            if c.is_model:
                model = c
                continue
            tokens = c.propose(history, min(c.most, room))
            if not tokens:
                continue
            grade = c.last_grade()
            proposals.append((c, tokens, grade))
            length, rate = paying(c.acceptance_for(grade), beta, len(tokens))
            if length and rate > best_yield * 1.0001:
                best, best_tokens, best_yield, best_grade = c, tokens[:length], rate, grade
        if model is not None:
            gamma = self._model_extra()
            k = min(model.most, room)
            could_pay = gamma is None or paying(CERTAIN, beta, k, gamma)[0] > 0
            length, rate = (k, 0.0) if gamma is None else paying(model.acceptance, beta, k, gamma)
            probe = could_pay and best is None and model.idle > PROBE_EVERY
            model_pays = gamma is not None and length > 0
            if could_pay and (rate > best_yield * 1.0001 or probe or gamma is None):
                best, best_tokens = model, []
                k = length or k
        self._step = (proposals, best, beta)
        for c, tokens, grade in proposals:
            if c is not best and c.shadow is None:
                c.shadow = _Shadow(len(history), tokens, grade)
        if best is None:
            if proposals or model is not None:
                self.plain_steps += 1
            return PLAIN
        best.idle = 0
        best.shadow = None
        if best.is_model:
            best_tokens = best.propose(history, k)
        elif model is not None and model_pays and len(best_tokens) < room:
            # Copying while the free source matches, then the draft model goes on from the
            # end of the copied run (it pays on its own here).
            more = model.propose(history + best_tokens, min(model.most, room - len(best_tokens)))
            if more:
                model.idle = 0
                return Choice(best.name, best_tokens + more, len(best_tokens), best_grade)
        return Choice(best.name, best_tokens, grade=best_grade) if best_tokens else PLAIN

    def curve(self, choice: Choice, most: int) -> list[float] | None:
        """This step's part in a batched pass's width (``batch_width``): the tokens the row
        emits on average by draft length ``0..n``, ``n`` what its source proposed (at most
        ``most``), the proposal the row drafts at any width (``_offer``); ``[1.0]`` when no
        source proposed. None: a draft this step that is not the batch's to size (a chain
        into a draft model, a source the client named, no step chosen)."""
        if self._step is None or choice.chained is not None or not self.paced:
            return None
        offer = _offer(*self._step)
        if offer is None:
            return [1.0]
        c, tokens, grade = offer
        if choice.source not in (None, c.name):
            return None
        return c.acceptance_for(grade).expected_upto(min(len(tokens), most))

    def resize(self, choice: Choice, n: int) -> Choice:
        """``choice`` as ``n`` tokens of the proposal ``curve`` priced: longer where the
        batch's pass is wider than the row's own rule drafts (the positions cost the row
        nothing), shorter or none where the row's rule drafts further than pays the batch.
        What is not drafted stays a shadow, so the source's acceptance keeps learning."""
        if self._step is None or choice.chained is not None or n == len(choice.tokens):
            return choice
        offer = _offer(*self._step)
        if offer is None:
            return choice
        c, tokens, grade = offer
        if choice.source not in (None, c.name):
            return choice
        if n <= 0:
            if c.shadow is None:
                c.shadow = _Shadow(self._at, tokens, grade)
            self.plain_steps += 1
            return PLAIN
        if choice.source is None:
            self.plain_steps -= 1  # counted plain by ``choose``: it drafts after all
        if c.shadow is not None and c.shadow.tokens is tokens:
            c.shadow = None  # drafted after all: verified, not shadowed
        c.idle = 0
        return Choice(c.name, tokens[:n], grade=grade)

    def _first(self, history: list[int], room: int) -> Choice:
        for c in self.candidates:
            if tokens := c.propose(history, min(c.most, room)):
                return Choice(c.name, tokens)
        return PLAIN

    def verified(self, choice: Choice, accepted: int) -> None:
        """The target kept ``accepted`` of ``choice``'s tokens (a chained draft: each
        source's part judged on its own, the draft model's only if the run reached it)."""
        by_name = {c.name: c for c in self.candidates}
        for name, first, end in choice.parts():
            if accepted < first:
                break  # refused before this part: it says nothing of this source
            kept = min(accepted, end) - first
            if (c := by_name.get(name)) is not None:
                grade = choice.grade if name == choice.source else None
                c.observe(grade, kept, 1 if kept < end - first else 0)
            tally = self.tallies.setdefault(name, Tally())
            tally.drafted += end - first
            tally.accepted += kept
            tally.steps += 1

    def passed(self, width: int, seconds: float) -> None:
        """A pass of ``width`` positions (this sequence's rows) took ``seconds``."""
        self.cost.observe(self.rows, width, seconds)

    def drafted_model(self, passes: int, seconds: float) -> None:
        """The draft model's proposal ran ``passes`` passes in ``seconds``."""
        self.draft_cost.observe(passes, seconds, self.cost.plain(1))

    def acceptances(self) -> dict[str, Acceptance]:
        return {c.name: c.acceptance for c in self.candidates}

    def sources_report(self) -> dict[str, dict[str, int]]:
        return {
            name: {"drafted": t.drafted, "accepted": t.accepted, "steps": t.steps}
            for name, t in self.tallies.items()
        }


def gap_filler(candidates: Sequence[DraftCandidate]) -> DraftCandidate | None:
    """The one source that fills a constrained answer's gaps between its grammar's forced
    runs (``ConstraintDraft.draft`` takes one proposer), on either lane: the cheapest that
    copies, the client's earlier answers (``suffix``: tool calls and JSON repeat their own
    structure across turns), then the first other free source (the context, a prediction);
    the draft model only where it is the only one."""
    free = [c for c in candidates if not c.is_model]
    suffix = next((c for c in free if c.name == "suffix"), None)
    if suffix is not None:
        return suffix
    if free:
        return free[0]
    return candidates[0] if candidates else None


_Proposal = tuple[DraftCandidate, list[int], int | None]  # a free source's tokens and grade


def _offer(proposals: list[_Proposal], best: DraftCandidate | None, beta: Cost) -> _Proposal | None:
    """The proposal a wider pass would draft for free: the drafting source's, else (a plain
    step) the one with the best yield."""
    if not proposals:
        return None
    if best is not None:
        return next((p for p in proposals if p[0] is best), None)

    def rate(p: _Proposal) -> float:
        return best_rate(p[0].acceptance_for(p[2]), beta, len(p[1]))

    return max(proposals, key=rate)


def prior(source: str) -> tuple[float, float]:
    """A source's acceptance before any evidence: a ``prediction`` is its client's own
    statement of the answer, so it starts trusted."""
    return PREDICTION_PRIOR if source == "prediction" else PRIOR


class Evidence:
    """Each source's acceptance per client partition, carried from a request to the next
    (bounded: least recently used partitions are dropped)."""

    def __init__(self, partitions: int = EVIDENCE_PARTITIONS) -> None:
        self.partitions = partitions
        self._by: OrderedDict[str, dict[str, tuple[float, float]]] = OrderedDict()

    def acceptance(self, partition: str, source: str) -> Acceptance:
        """A new sequence's acceptance for ``source``: the partition's carried figure
        (weighed down to ``CARRY_WEIGHT`` observations over the prior), else the prior."""
        start = prior(source)
        carried = self._by.get(partition, {}).get(source)
        if carried is None:
            return Acceptance(start)
        self._by.move_to_end(partition)
        kept, rejected = carried
        total = kept + rejected
        scale = min(1.0, CARRY_WEIGHT / total) if total > 0 else 0.0
        # The prior stays in at a small weight: one bad request cannot rule a source out.
        return Acceptance((kept * scale + start[0] * 0.25, rejected * scale + start[1] * 0.25))

    def record(self, partition: str, acceptances: Mapping[str, Acceptance]) -> None:
        """A sequence ended: its sources' acceptance become the partition's."""
        if not acceptances:
            return
        entry = self._by.setdefault(partition, {})
        self._by.move_to_end(partition)
        for source, a in acceptances.items():
            entry[source] = (a.kept, a.rejected)
        while len(self._by) > self.partitions:
            self._by.popitem(last=False)

    def report(self) -> Mapping[str, object]:
        return {"evidence_partitions": len(self._by)}
