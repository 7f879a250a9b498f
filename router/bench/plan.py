"""Fit the matrix into a time budget, and estimate the time left (pure).

The warm-up measures each lane once; from that the planner estimates every cell and, while
the whole matrix would overrun the budget, shrinks it in a fixed order (each step only
while still over budget, and never a dimension the user set explicitly):

1. ``runs`` down to 1;
2. ``max_tokens`` halved, down to ``MIN_MAX_TOKENS``;
3. the highest concurrency levels dropped, down to two levels;
4. above the lowest concurrency level, the prompt families after the first dropped;
5. the concurrency levels down to the lowest one;
6. the prompt families down to the first one.

The reductions are written into the scorecard. A machine fast enough runs the whole matrix;
a slow CPU gets the figures that matter most (every family at concurrency 1, where the
speculative lane is meant to be used, and one family under load) within the budget.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, replace

from router.bench.matrix import MIN_MAX_TOKENS, Cell, MatrixSpec
from router.bench.records import Measurement

# How much longer c concurrent requests take on the batching lane than one: c ** exponent.
# 1.0 would be no batching gain at all; planning assumes a modest gain so that a slow CPU
# is not promised a run it cannot finish (the estimate of time left corrects itself from
# the cells already measured).
BATCH_EXPONENT = 0.8
SERIAL_SCENARIOS = ("spec-on", "spec-off")  # the speculative lane decodes one at a time
DEFAULT_BUDGET = 480.0  # seconds of measurement; plus start-up and warm-up: under 10 minutes
QUICK_BUDGET = 80.0  # plus start-up and warm-up: under 2 minutes


@dataclass(frozen=True)
class LaneSpeed:
    ttft: float  # seconds to the first token of a short prompt
    decode_tps: float  # tokens per second after the first, one request alone


@dataclass(frozen=True)
class Speeds:
    by_scenario: Mapping[str, LaneSpeed]
    long_ttft_factor: float = 1.0  # TTFT of the long prompt / TTFT of a short one

    def of(self, scenario: str) -> LaneSpeed:
        if scenario in self.by_scenario:
            return self.by_scenario[scenario]
        known = list(self.by_scenario.values())
        if not known:
            return LaneSpeed(1.0, 10.0)
        # The slowest lane known: over-estimating is the safe side of a budget.
        return LaneSpeed(max(s.ttft for s in known), min(s.decode_tps for s in known))


def speeds_from(warmups: Sequence[Measurement]) -> Speeds | None:
    """Each lane's speed from its last successful warm-up request; None when none worked."""
    by: dict[str, LaneSpeed] = {}
    long_ttft: dict[str, float] = {}
    for m in warmups:
        if not m.ok or m.ttft is None:
            continue
        if m.family == "long":
            long_ttft[m.scenario] = m.ttft
        elif (tps := m.decode_tps) is not None:
            by[m.scenario] = LaneSpeed(m.ttft, tps)
    if not by:
        return None
    factors = [t / by[s].ttft for s, t in long_ttft.items() if s in by and by[s].ttft > 0]
    return Speeds(by, max(1.0, max(factors, default=1.0)))


@dataclass(frozen=True)
class Plan:
    spec: MatrixSpec
    cells: tuple[Cell, ...]
    reductions: tuple[str, ...] = ()
    estimate: float | None = None  # seconds, None when no speeds were known

    @classmethod
    def full(cls, spec: MatrixSpec) -> Plan:
        return cls(spec, spec.cells())

    @property
    def concurrency(self) -> tuple[int, ...]:
        return tuple(sorted({c.concurrency for c in self.cells}))

    @property
    def families(self) -> tuple[str, ...]:
        present = {c.family for c in self.cells}
        return tuple(f for f in self.spec.families if f in present)

    @property
    def scenarios(self) -> tuple[str, ...]:
        present = {c.scenario for c in self.cells}
        return tuple(s for s in self.spec.scenarios if s in present)


def request_seconds(speeds: Speeds, scenario: str, family: str, max_tokens: int) -> float:
    if scenario == "auto":  # the speculative lane alone, or a mix: the slower of the two
        return max(request_seconds(speeds, s, family, max_tokens)
                   for s in ("spec-on", "batching"))
    lane = speeds.of(scenario)
    ttft = lane.ttft * (speeds.long_ttft_factor if family == "long" else 1.0)
    return ttft + (max_tokens - 1) / max(lane.decode_tps, 1e-6)


def cell_seconds(cell: Cell, spec: MatrixSpec, speeds: Speeds) -> float:
    one = request_seconds(speeds, cell.scenario, cell.family, spec.max_tokens)
    if cell.scenario in SERIAL_SCENARIOS:
        return cell.concurrency * spec.runs * one
    return spec.runs * one * cell.concurrency ** BATCH_EXPONENT


def estimate(cells: Iterable[Cell], spec: MatrixSpec, speeds: Speeds) -> float:
    return sum(cell_seconds(c, spec, speeds) for c in cells)


Step = Callable[[Plan], Plan | None]


def _fewer_runs(plan: Plan) -> Plan | None:
    if plan.spec.runs <= 1:
        return None
    return _respec(plan, plan.spec.with_(runs=1), f"runs {plan.spec.runs} → 1")


def _fewer_tokens(plan: Plan) -> Plan | None:
    n = plan.spec.max_tokens
    if n <= MIN_MAX_TOKENS:
        return None
    m = max(MIN_MAX_TOKENS, n // 2)
    return _respec(plan, plan.spec.with_(max_tokens=m), f"max_tokens {n} → {m}")


def _drop_top_level(plan: Plan, keep: int) -> Plan | None:
    levels = plan.concurrency
    if len(levels) <= keep:
        return None
    kept = levels[:keep] if keep == 1 else levels[:-1]
    cells = tuple(c for c in plan.cells if c.concurrency in kept)
    return _recell(plan, cells, f"concurrency {_csv(levels)} → {_csv(kept)}")


def _one_family_under_load(plan: Plan) -> Plan | None:
    low = min(plan.concurrency)
    loaded = [f for f in plan.families if any(
        c.family == f and c.concurrency > low for c in plan.cells)]
    if len(loaded) <= 1:
        return None
    drop = loaded[-1]
    cells = tuple(c for c in plan.cells if not (c.family == drop and c.concurrency > low))
    kept = loaded[:-1]
    return _recell(plan, cells, f"families above c={low}: {_csv(loaded)} → {_csv(kept)}")


def _one_family(plan: Plan) -> Plan | None:
    families = plan.families
    if len(families) <= 1:
        return None
    kept = families[:-1]
    cells = tuple(c for c in plan.cells if c.family in kept)
    return _recell(plan, cells, f"families {_csv(families)} → {_csv(kept)}")


def fit(spec: MatrixSpec, speeds: Speeds | None, budget: float | None,
        fixed: frozenset[str] = frozenset()) -> Plan:
    """The largest plan (by the order above) whose estimate fits ``budget`` seconds; the
    smallest one when none fits. ``budget`` None or 0, or no speeds: the whole matrix."""
    if speeds is None:
        return Plan.full(spec)
    plan = _estimated(Plan.full(spec), speeds)
    if not budget:
        return plan
    steps: list[tuple[str, Step]] = [
        ("runs", _fewer_runs),
        ("max_tokens", _fewer_tokens),
        ("concurrency", lambda p: _drop_top_level(p, keep=2)),
        ("families", _one_family_under_load),
        ("concurrency", lambda p: _drop_top_level(p, keep=1)),
        ("families", _one_family),
    ]
    for dimension, step in steps:
        if dimension in fixed:
            continue
        while plan.estimate is not None and plan.estimate > budget:
            smaller = step(plan)
            if smaller is None:
                break
            plan = _estimated(smaller, speeds)
    return plan


def eta(remaining_estimate: float, done_estimate: float, done_actual: float) -> float:
    """Seconds left: the remaining estimate, scaled by how far off the estimate was so far."""
    if done_estimate <= 0 or done_actual <= 0:
        return remaining_estimate
    return remaining_estimate * done_actual / done_estimate


def _estimated(plan: Plan, speeds: Speeds) -> Plan:
    return replace(plan, estimate=estimate(plan.cells, plan.spec, speeds))


def _respec(plan: Plan, spec: MatrixSpec, note: str) -> Plan:
    return replace(plan, spec=spec, reductions=_merge(plan.reductions, note))


def _recell(plan: Plan, cells: tuple[Cell, ...], note: str) -> Plan:
    return replace(plan, cells=cells, reductions=_merge(plan.reductions, note))


def _merge(notes: tuple[str, ...], note: str) -> tuple[str, ...]:
    """Successive steps on one dimension read as one: 'max_tokens 64 → 32 → 24'."""
    if notes and _head(notes[-1]) == _head(note):
        return (*notes[:-1], f"{notes[-1]} → {note.rsplit('→ ', 1)[1]}")
    return (*notes, note)


def _head(note: str) -> str:
    return note.split(":", 1)[0] if ":" in note else note.split(" ", 1)[0]


def _csv(values: Iterable[object]) -> str:
    return ",".join(str(v) for v in values)

