"""What the scorecard measures, and fitting it into a time budget (pure): scenario x prompt
family x concurrency, cut step by step (``STEPS``) until the estimate from the warm-up's
speeds fits, so that a slow CPU still gets the figures that matter most."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from router.bench.scorecard.prompts import FAMILIES

SCENARIO_NAMES = ("spec-on", "spec-off", "batching", "auto")
FAMILY_NAMES = tuple(FAMILIES)
# Above the router's short-output rule (16 tokens by default): shorter answers go to the
# batching lane whatever speculation would do, and decode speeds of so few tokens are noise.
MIN_MAX_TOKENS = 24


@dataclass(frozen=True)
class Scenario:
    title: str
    lane_header: str | None
    body_extra: dict[str, Any] = field(default_factory=dict)

    @property
    def how(self) -> str:
        lane = self.lane_header
        parts = [f"`X-Speclane-Lane: {lane}`" if lane else "no lane header (the router decides)"]
        return " + ".join(parts + [f'`"{k}": {v}`' for k, v in self.body_extra.items()])


# spec-off is plain decoding of the same model on the same lane: the baseline speculation
# must beat; auto sends no lane header and reads the router's choice from the response.
SCENARIOS: dict[str, Scenario] = {
    # The pair is what is judged: its draft model drafts (named, whatever the lane's choice).
    "spec-on": Scenario(
        "Speculative lane, speculation on", "speculative", {"draft_source": "draft_model"}
    ),
    "spec-off": Scenario(
        "Speculative lane, speculation off", "speculative", {"num_draft_tokens": 0}
    ),
    "batching": Scenario("Batching lane", "batching"),
    "auto": Scenario("Router's automatic routing", None),
}


@dataclass(frozen=True, order=True)
class Cell:
    scenario: str
    family: str
    concurrency: int

    @property
    def label(self) -> str:
        return f"{self.scenario} · {self.family} · c={self.concurrency}"


@dataclass(frozen=True)
class MatrixSpec:
    """The matrix asked for; ``runs`` requests per concurrent client loop (a cell at
    concurrency c sends c x runs requests)."""

    scenarios: tuple[str, ...] = SCENARIO_NAMES
    families: tuple[str, ...] = FAMILY_NAMES
    concurrency: tuple[int, ...] = (1, 2, 4, 8)
    runs: int = 2
    max_tokens: int = 64
    long_prompt_chars: int = 3000

    def __post_init__(self) -> None:
        unknown = [s for s in self.scenarios if s not in SCENARIOS]
        unknown += [f for f in self.families if f not in FAMILIES]
        if unknown:
            raise ValueError(f"unknown scenario or family: {', '.join(unknown)}")
        if not self.scenarios or not self.families or not self.concurrency:
            raise ValueError("scenarios, families and concurrency must not be empty")
        if min(self.concurrency) < 1 or self.runs < 1 or self.max_tokens < 2:
            raise ValueError("concurrency and runs must be >= 1, max_tokens >= 2")
        object.__setattr__(self, "scenarios", tuple(self.scenarios))  # lists from JSON
        object.__setattr__(self, "families", tuple(self.families))
        object.__setattr__(self, "concurrency", tuple(sorted(set(self.concurrency))))

    def cells(self) -> tuple[Cell, ...]:
        # Scenarios innermost: the four ways of serving one (family, concurrency) run back to
        # back, so a burst of load from elsewhere on the machine hits them alike.
        return tuple(
            Cell(s, f, c) for c in self.concurrency for f in self.families for s in self.scenarios
        )


DEFAULT_SPEC = MatrixSpec()
QUICK_SPEC = MatrixSpec(
    families=("chat", "list"),
    concurrency=(1, 2),
    runs=1,
    max_tokens=MIN_MAX_TOKENS,
    long_prompt_chars=1500,
)


# How much longer c concurrent requests take on the batching lane than one: c ** exponent.
# 1.0 would be no batching gain at all; a modest gain keeps a slow CPU from being promised a
# run it cannot finish (the time left corrects itself from the cells already measured).
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
        # The slowest lane known (records.speeds_from knows one at least): over-estimating is
        # the safe side of a budget.
        known = self.by_scenario.values()
        return LaneSpeed(max(s.ttft for s in known), min(s.decode_tps for s in known))


@dataclass(frozen=True)
class Plan:
    spec: MatrixSpec
    cells: tuple[Cell, ...]
    reductions: tuple[str, ...] = ()
    estimate: float | None = None  # seconds, None when no speeds were known
    cell_estimates: tuple[float, ...] = ()  # each cell's seconds (the progress line's ETA)

    @property
    def concurrency(self) -> tuple[int, ...]:
        return tuple(sorted({c.concurrency for c in self.cells}))

    @property
    def families(self) -> tuple[str, ...]:
        return tuple(f for f in self.spec.families if any(c.family == f for c in self.cells))

    @property
    def scenarios(self) -> tuple[str, ...]:
        return tuple(s for s in self.spec.scenarios if any(c.scenario == s for c in self.cells))


def request_seconds(speeds: Speeds, scenario: str, family: str, max_tokens: int) -> float:
    if scenario == "auto":  # the speculative lane alone, or a mix: the slower of the two
        return max(request_seconds(speeds, s, family, max_tokens) for s in ("spec-on", "batching"))
    lane = speeds.of(scenario)
    ttft = lane.ttft * (speeds.long_ttft_factor if family == "long" else 1.0)
    return ttft + (max_tokens - 1) / max(lane.decode_tps, 1e-6)


def cell_seconds(cell: Cell, spec: MatrixSpec, speeds: Speeds) -> float:
    one = request_seconds(speeds, cell.scenario, cell.family, spec.max_tokens)
    if cell.scenario in SERIAL_SCENARIOS:
        return cell.concurrency * spec.runs * one
    return spec.runs * one * cell.concurrency**BATCH_EXPONENT


def _fewer_runs(plan: Plan) -> Plan | None:
    spec = plan.spec
    return _cut(plan, "runs", spec.runs, 1, spec=replace(spec, runs=1)) if spec.runs > 1 else None


def _fewer_tokens(plan: Plan) -> Plan | None:
    n = plan.spec.max_tokens
    if (m := max(MIN_MAX_TOKENS, n // 2)) >= n:
        return None
    return _cut(plan, "max_tokens", n, m, spec=replace(plan.spec, max_tokens=m))


def _drop_top_level(plan: Plan, keep: int) -> Plan | None:
    levels = plan.concurrency
    if len(levels) <= keep:
        return None
    kept = levels[:keep] if keep == 1 else levels[:-1]
    cells = tuple(c for c in plan.cells if c.concurrency in kept)
    return _cut(plan, "concurrency", levels, kept, cells=cells)


def _one_family_under_load(plan: Plan) -> Plan | None:
    low = min(plan.concurrency)
    busy = {c.family for c in plan.cells if c.concurrency > low}
    if len(loaded := [f for f in plan.families if f in busy]) <= 1:
        return None
    cells = tuple(c for c in plan.cells if c.family != loaded[-1] or c.concurrency == low)
    return _cut(plan, f"families above c={low}:", loaded, loaded[:-1], cells=cells)


def _one_family(plan: Plan) -> Plan | None:
    if len(families := plan.families) <= 1:
        return None
    cells = tuple(c for c in plan.cells if c.family in families[:-1])
    return _cut(plan, "families", families, families[:-1], cells=cells)


# The order of the cuts: what matters least first; every family at the lowest level last.
STEPS: tuple[tuple[str, Callable[[Plan], Plan | None]], ...] = (
    ("runs", _fewer_runs),
    ("max_tokens", _fewer_tokens),
    ("concurrency", lambda p: _drop_top_level(p, keep=2)),
    ("families", _one_family_under_load),
    ("concurrency", lambda p: _drop_top_level(p, keep=1)),
    ("families", _one_family),
)


def fit(
    spec: MatrixSpec,
    speeds: Speeds | None,
    budget: float | None,
    fixed: frozenset[str] = frozenset(),
) -> Plan:
    """The largest plan whose estimate fits ``budget`` seconds, cut in the order of ``STEPS``
    (never on a dimension in ``fixed``); the smallest one when none fits. ``budget`` None or
    0, or no speeds: the whole matrix."""
    if speeds is None:
        return Plan(spec, spec.cells())
    plan = _estimated(Plan(spec, spec.cells()), speeds)
    if not budget:
        return plan
    for dimension, step in STEPS:
        while dimension not in fixed and plan.estimate is not None and plan.estimate > budget:
            if (smaller := step(plan)) is None:
                break
            plan = _estimated(smaller, speeds)
    return plan


def _estimated(plan: Plan, speeds: Speeds) -> Plan:
    each = tuple(cell_seconds(c, plan.spec, speeds) for c in plan.cells)
    return replace(plan, estimate=sum(each), cell_estimates=each)


def _cut(plan: Plan, label: str, before: object, after: object, **changes: Any) -> Plan:
    """``plan`` with ``changes``, noted; successive cuts of one dimension read as one note:
    'max_tokens 64 → 32 → 24'."""
    old, new = (
        ",".join(map(str, v)) if isinstance(v, tuple | list) else str(v) for v in (before, after)
    )
    notes, last = plan.reductions, "".join(plan.reductions[-1:])
    if last.startswith(f"{label} ") and last.endswith(f"→ {old}"):
        notes = (*notes[:-1], f"{last} → {new}")
    else:
        notes = (*notes, f"{label} {old} → {new}")
    return replace(plan, reductions=notes, **changes)
