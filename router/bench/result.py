"""Everything one scorecard run produced, and its JSON form (which can be read back)."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from router.bench.matrix import SCENARIOS, Cell, MatrixSpec
from router.bench.plan import Plan
from router.bench.records import CellRun, Measurement
from router.bench.score import Evaluation, Thresholds, evaluate
from router.bench.summary import cell_summary

SCHEMA = "speclane-scorecard/1"


@dataclass
class Result:
    requested: MatrixSpec
    plan: Plan
    thresholds: Thresholds
    environment: dict[str, Any] = field(default_factory=dict)
    warmup: list[Measurement] = field(default_factory=list)
    runs: list[CellRun] = field(default_factory=list)
    complete: bool = False
    stopped: str | None = None  # why the run ended early
    budget: float | None = None
    duration: float = 0.0

    def evaluation(self) -> Evaluation:
        return evaluate(self.runs, self.thresholds, self.complete)

    @property
    def model(self) -> str | None:
        return self.environment.get("model")

    @property
    def draft(self) -> str | None:
        return self.environment.get("draft_model")


def to_json(result: Result, evaluation: Evaluation | None = None) -> dict[str, Any]:
    ev = evaluation or result.evaluation()
    plan = result.plan
    return {
        "schema": SCHEMA,
        "complete": result.complete,
        "stopped": result.stopped,
        "duration_s": round(result.duration, 3),
        "environment": result.environment,
        "settings": {
            "requested": asdict(result.requested),
            "plan": {
                "scenarios": list(plan.scenarios), "families": list(plan.families),
                "concurrency": list(plan.concurrency), "runs": plan.spec.runs,
                "max_tokens": plan.spec.max_tokens,
                "long_prompt_chars": plan.spec.long_prompt_chars,
                "cells": [asdict(c) for c in plan.cells],
                "reductions": list(plan.reductions), "estimate_s": plan.estimate,
                "budget_s": result.budget,
            },
            "scenarios": {name: {"title": s.title, "how": s.how} for name, s in
                          SCENARIOS.items() if name in plan.scenarios},
        },
        "warmup": [m.to_json() for m in result.warmup],
        "cells": [{**run.to_json(), "summary": cell_summary(run).to_json()}
                  for run in result.runs],
        "evaluation": ev.to_json(),
        "pairs": [pair(result, ev)],
    }


def pair(result: Result, ev: Evaluation) -> dict[str, Any]:
    """The measured acceptance of the (target, draft) pair, for the pair allow/deny list."""
    spec_on = [m for r in result.runs if r.cell.scenario == "spec-on" for m in r.measurements]
    drafted = sum(m.drafted or 0 for m in spec_on if m.ok)
    accepted = sum(m.accepted or 0 for m in spec_on if m.ok)
    gate = ev.gate("acceptance")
    return {
        "target": result.model,
        "draft": result.draft,
        "num_draft_tokens": result.environment.get("num_draft_tokens"),
        "acceptance": ev.pooled_acceptance,
        "drafted": drafted,
        "accepted": accepted,
        "acceptance_by_family": {a.family: a.acceptance for a in ev.acceptance},
        "floor": result.thresholds.acceptance_floor,
        "passed_floor": gate.passed,
        "measured_at": result.environment.get("date"),
        "hardware": (result.environment.get("hardware") or {}).get("mlx_device"),
    }


def from_json(data: dict[str, Any]) -> Result:
    if data.get("schema") != SCHEMA:
        raise ValueError(f"not a speclane scorecard (schema {data.get('schema')!r})")
    settings = data["settings"]
    fields: dict[str, Any] = {k: tuple(v) if isinstance(v, list) else v
                              for k, v in settings["requested"].items()}
    requested = MatrixSpec(**fields)
    p = settings["plan"]
    spec = requested.with_(runs=p["runs"], max_tokens=p["max_tokens"],
                           long_prompt_chars=p["long_prompt_chars"])
    plan = Plan(spec, tuple(Cell(**c) for c in p["cells"]), tuple(p["reductions"]),
                p["estimate_s"])
    thresholds = Thresholds(**data["evaluation"]["thresholds"])
    return Result(requested, plan, thresholds, data["environment"],
                  [Measurement.from_json(m) for m in data["warmup"]],
                  [CellRun.from_json(c) for c in data["cells"]], data["complete"],
                  data["stopped"], p["budget_s"], data["duration_s"])
