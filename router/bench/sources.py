"""The draft-source benchmark's pure parts: what each family is tried with, what a request's
body becomes for a variant, when auto-disable has decided, and the report's rows.

``examples/spec_families.py`` runs it. Every family is its own client (so its own workload);
per family, on the speculative lane:

- concurrency 1: plain decoding (``num_draft_tokens: 0``) and each draft source, interleaved
  request by request, so that a shared machine's drift weighs on all of them alike;
- concurrency 2: two identical requests at once per variant (the speculative lane serves one
  at a time, so the second waits: the aggregate shows what that costs), and plain decoding
  on the batching lane (what two streams get without speculation);
- then, without a lane header, requests until auto-disable has decided for the family, and
  the routed requests that are measured, one at a time and two at once.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from router.bench.edits import EDIT_FAMILIES
from router.bench.stats import mean

PLAIN = "plain"
# Sources named in the body (the speculative lane's ``draft_source`` request field).
BODY_SOURCES = ("prompt_lookup", "draft_model", "suffix")
PREDICTION_FAMILY = "refactor-with-prediction"


def variants(family: str) -> tuple[str, ...]:
    """Plain decoding and the draft sources a family is measured with. A request that
    carries a ``prediction`` drafts from it whatever else it names, so the prediction family
    is measured against plain decoding only (its other sources are the ``edit`` family)."""
    if family == PREDICTION_FAMILY:
        return (PLAIN, "prediction")
    return (PLAIN, *BODY_SOURCES)


def apply_variant(body: Mapping[str, Any], variant: str) -> dict[str, Any]:
    """The request body for one variant (``prediction``: the body already carries it)."""
    out = dict(body)
    if variant == PLAIN:
        out["num_draft_tokens"] = 0
    elif variant in BODY_SOURCES:
        out["draft_source"] = variant
    return out


def family_rows(state: Mapping[str, Any], family: str) -> list[dict[str, Any]]:
    """The speculative lane's ``GET /admin/spec`` rows of one family's client."""
    client = f"family-{family}"
    return [row for row in state.get("workloads", [])
            if row.get("backend") == "speculative"
            and str(row.get("workload", "")).split(":")[0] == client]


def row_decided(row: Mapping[str, Any]) -> bool:
    """Off, or on with a full acceptance window and enough speed samples to have judged."""
    if row.get("state") == "off":
        return True
    window, speed = row.get("window") or {}, row.get("speed") or {}
    return bool(window.get("judging")) and (
        speed.get("spec_samples", 0) >= speed.get("min_samples", 1)
        and speed.get("baseline_tps") is not None)


def decided(rows: Sequence[Mapping[str, Any]], source: str | None) -> bool:
    """Whether the rows of the source the router drafts this family with have decided
    (``source`` None: not known yet, then every row must have)."""
    chosen = [r for r in rows if source is None or r.get("source") == source]
    return bool(chosen) and all(row_decided(r) for r in chosen)


def summarise(runs: Iterable[Mapping[str, Any]]) -> dict[str, Any]:
    """One cell: mean tok/s of the streams (``tps``: from sending to the last token;
    ``decode_tps``: first to last token), draft totals, lanes and sources seen."""
    runs = list(runs)
    drafted = sum((r.get("spec") or {}).get("drafted", 0) for r in runs)
    accepted = sum((r.get("spec") or {}).get("accepted", 0) for r in runs)
    forced = sum((r.get("spec") or {}).get("forced", 0) for r in runs)
    return {
        "tps": mean([r["tps"] for r in runs if r.get("tps")]),
        "decode_tps": mean([r["decode_tps"] for r in runs if r.get("decode_tps")]),
        "drafted": drafted, "accepted": accepted,
        "acceptance": accepted / drafted if drafted else None, "forced": forced,
        "lanes": sorted({str(r.get("lane")) for r in runs}),
        "sources": sorted({str((r.get("spec") or {}).get("source")) for r in runs}),
        "tokens": [r.get("tokens", 0) for r in runs],
    }


def together(runs: Sequence[Mapping[str, Any]], wall: float) -> dict[str, Any]:
    """Streams sent at once: per-stream decode speed (``summarise``) and the aggregate."""
    tokens = sum(r.get("tokens", 0) for r in runs)
    return {**summarise(runs), "wall_s": wall,
            "aggregate_tps": tokens / wall if wall > 0 else None}


def ratio(a: float | None, b: float | None) -> float | None:
    return a / b if a and b else None


# Cross-request and constrained scenarios (``--scenarios``): one client, the speculative lane.
# ``repeat``: the same prompt again; ``near-repeat``: the same task with one name changed (a
# fresh name every round, the suffix variant first, so its index only holds other names'
# answers); ``tool-call`` and ``json-schema``: constrained answers, plain constrained decoding
# against the lane's default (the grammar's forced tokens, then the lane's source).
SCENARIO_VARIANTS = {
    "repeat": (PLAIN, "suffix"),
    "near-repeat": ("suffix", PLAIN),
    "tool-call": (PLAIN, "forced"),
    "json-schema": (PLAIN, "forced"),
}


def scenario_body(body: Mapping[str, Any], variant: str) -> dict[str, Any]:
    """``forced``: the body as it is (a constrained request drafts its forced tokens)."""
    return dict(body) if variant == "forced" else apply_variant(body, variant)


def scenario_table(results: Mapping[str, Any]) -> str:
    lines = ["| scenario | variant | acceptance | forced | tok/s | / plain |",
             "|---|---|---|---|---|---|"]
    for name, cells in results.items():
        plain = cells[PLAIN]["tps"]
        for variant, cell in cells.items():
            acc = "-" if cell["acceptance"] is None else (
                f"{cell['acceptance']:.2f} ({cell['accepted']}/{cell['drafted']})")
            lines.append(f"| {name} | {variant} | {acc} | {cell.get('forced', 0)} | "
                         f"{_f(cell['tps'], '.1f')} | {_f(ratio(cell['tps'], plain))} |")
    return "\n".join(lines)


def scenario_goals(results: Mapping[str, Any]) -> dict[str, Any]:
    """The issue's goals: a repeated prompt's answer >= 2x, constrained answers >= 1.3x."""
    def over(name: str, variant: str) -> float | None:
        cells = results.get(name)
        return ratio(cells[variant]["tps"], cells[PLAIN]["tps"]) if cells else None

    return {
        "repeat_suffix": over("repeat", "suffix"),
        "near_repeat_suffix": over("near-repeat", "suffix"),
        "tool_call_forced": over("tool-call", "forced"),
        "json_schema_forced": over("json-schema", "forced"),
        "met": {
            "repeat>=2.0": _at_least(over("repeat", "suffix"), 2.0),
            "tool_call>=1.3": _at_least(over("tool-call", "forced"), 1.3),
            "json_schema>=1.3": _at_least(over("json-schema", "forced"), 1.3),
        },
    }


def _f(value: Any, spec: str = ".2f") -> str:
    return "-" if value is None else format(value, spec)


def table(results: Mapping[str, Any]) -> str:
    """The markdown table of a run: one row per family and variant, then the routed row."""
    lines = [
        "| family | variant | acceptance | c=1 tok/s | c=1 / plain | c=2 per stream | "
        "c=2 aggregate (/ plain on batching) |",
        "|---|---|---|---|---|---|---|",
    ]
    for family, r in results.items():
        plain = r["c1"][PLAIN]["tps"]
        batch = (r.get("c2_batching") or {}).get("aggregate_tps")
        for variant, cell in r["c1"].items():
            c2 = r["c2"].get(variant) or {}
            c2_tps = c2.get("aggregate_tps")
            acc = "-" if cell["acceptance"] is None else (
                f"{cell['acceptance']:.2f} ({cell['accepted']}/{cell['drafted']})")
            lines.append(
                f"| {family} | {variant} | {acc} | {_f(cell['tps'], '.1f')} | "
                f"{_f(ratio(cell['tps'], plain))} | {_f(c2.get('tps'), '.1f')} | "
                f"{_f(c2_tps, '.1f')} ({_f(ratio(c2_tps, batch))}) |")
        routed, routed2 = r["routed"], r.get("routed_c2") or {}
        ad = ", ".join(f"{row.get('source')}: {row['state']} ({row['reason']})"
                       for row in r.get("auto_disable", [])) or "-"
        lines.append(
            f"| {family} | **routed** ({', '.join(routed['lanes'])}; "
            f"{', '.join(routed['sources'])}) | {ad} | {_f(routed['tps'], '.1f')} | "
            f"**{_f(ratio(routed['tps'], _plain_beside_routed(r)))}** | "
            f"{_f(routed2.get('tps'), '.1f')} | "
            f"{_f(routed2.get('aggregate_tps'), '.1f')} "
            f"({_f(ratio(routed2.get('aggregate_tps'), batch))}) |")
    return "\n".join(lines)


def goals(results: Mapping[str, Any]) -> dict[str, Any]:
    """The issue's goals as ratios of this run: prediction >= 2.0x and prompt lookup >= 1.5x
    plain on the edit families; no family routed below 0.95x plain once decided."""
    def c1(family: str, variant: str) -> float | None:
        r = results.get(family)
        if not r or variant not in r["c1"]:
            return None
        return ratio(r["c1"][variant]["tps"], r["c1"][PLAIN]["tps"])

    routed = {f: ratio(r["routed"]["tps"], _plain_beside_routed(r)) for f, r in results.items()}
    worst = min((v for v in routed.values() if v is not None), default=None)
    return {
        "prediction_on_edits": c1(PREDICTION_FAMILY, "prediction"),
        "prompt_lookup_on_edits": c1("edit", "prompt_lookup"),
        "routed_over_plain": routed,
        "met": {
            "prediction>=2.0": _at_least(c1(PREDICTION_FAMILY, "prediction"), 2.0),
            "prompt_lookup>=1.5": _at_least(c1("edit", "prompt_lookup"), 1.5),
            "routed>=0.95 everywhere": _at_least(worst, 0.95),
        },
    }


def _plain_beside_routed(r: Mapping[str, Any]) -> float | None:
    """Plain decoding measured between the routed requests (older runs: at concurrency 1)."""
    beside = (r.get("plain_beside_routed") or {}).get("tps")
    return beside or r["c1"][PLAIN]["tps"]


def _at_least(value: float | None, bound: float) -> bool | None:
    return None if value is None else value >= bound


__all__ = ["BODY_SOURCES", "EDIT_FAMILIES", "PLAIN", "SCENARIO_VARIANTS", "apply_variant",
           "decided", "family_rows", "goals", "row_decided", "scenario_body", "scenario_goals",
           "scenario_table", "summarise", "table", "together", "variants"]
