"""The draft-source benchmark's figures (pure): whether auto-disable has settled for a family,
each cell's summary, the tables and the goals (``examples/spec_families.py`` runs it)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from router.bench.common.stats import fmt, mean, ratio
from router.bench.sources.plan import PLAIN, PREDICTION_FAMILY


def family_rows(state: Mapping[str, Any], family: str) -> list[dict[str, Any]]:
    """The speculative lane's ``GET /admin/spec`` rows of one family's client."""
    client = f"family-{family}"
    return [
        row
        for row in state.get("workloads", [])
        if row.get("backend") == "speculative"
        and str(row.get("workload", "")).split(":")[0] == client
    ]


def settled(rows: Sequence[Mapping[str, Any]], source: str | None, lane: str | None) -> bool:
    """Whether routed requests now measure a decision: sent to the batching lane (every
    source off), or drafting with a source that stayed on once judged (a full acceptance
    window and enough speed samples). A source just turned off has not settled (the family's
    next source is judged in turn); a plain request on the speculative lane (``source`` None:
    a baseline sample) says nothing."""
    if lane == "batching":
        return True
    chosen = [r for r in rows if source is not None and r.get("source") == source]
    if not chosen and source == "auto":
        # The lane chose per step, and the router keyed the workload by the source it
        # allowed (a request's own ``prediction``): that row is the decision.
        chosen = list(rows)
    return bool(chosen) and all(_judged_on(r) for r in chosen)


def _judged_on(row: Mapping[str, Any]) -> bool:
    window, speed = row.get("window") or {}, row.get("speed") or {}
    samples = speed.get("spec_samples", 0) >= speed.get("min_samples", 1)
    judged = bool(window.get("judging")) and samples and speed.get("baseline_tps") is not None
    return row.get("state") == "on" and judged


def summarise(runs: Iterable[Mapping[str, Any]]) -> dict[str, Any]:
    """One cell: mean tok/s of the streams (``tps``: from sending to the last token;
    ``decode_tps``: first to last token), draft totals, lanes and sources seen."""
    runs = list(runs)
    specs = [r.get("spec") or {} for r in runs]
    drafted = sum(s.get("drafted", 0) for s in specs)
    accepted = sum(s.get("accepted", 0) for s in specs)
    return {
        "tps": mean([r["tps"] for r in runs if r.get("tps")]),
        "decode_tps": mean([r["decode_tps"] for r in runs if r.get("decode_tps")]),
        "drafted": drafted,
        "accepted": accepted,
        "acceptance": accepted / drafted if drafted else None,
        "forced": sum(s.get("forced", 0) for s in specs),
        "lanes": sorted({str(r.get("lane")) for r in runs}),
        "sources": sorted({str(s.get("source")) for s in specs}),
        "tokens": [r.get("tokens", 0) for r in runs],
    }


def together(runs: Sequence[Mapping[str, Any]], wall: float) -> dict[str, Any]:
    """Streams sent at once: per-stream decode speed (``summarise``) and the aggregate."""
    tokens = sum(r.get("tokens", 0) for r in runs)
    return {**summarise(runs), "wall_s": wall, "aggregate_tps": tokens / wall if wall > 0 else None}


def _acceptance(cell: Mapping[str, Any]) -> str:
    if cell["acceptance"] is None:
        return "-"
    return f"{cell['acceptance']:.2f} ({cell['accepted']}/{cell['drafted']})"


def _plain_beside_routed(r: Mapping[str, Any]) -> float | None:
    """Plain decoding measured between the routed requests (older runs: at concurrency 1)."""
    return (r.get("plain_beside_routed") or {}).get("tps") or r["c1"][PLAIN]["tps"]


def _tps(value: float | None) -> str:
    return fmt(value, "{:.1f}")


def _aggregate(cell: Mapping[str, Any], batching: float | None) -> str:
    """Streams at once: their aggregate tok/s (over plain decoding's on the batching lane)."""
    value = cell.get("aggregate_tps")
    return f"{_tps(value)} ({fmt(ratio(value, batching))})"


def _markdown(header: str, rows: Iterable[Sequence[object]]) -> str:
    """A Markdown table (its header: the cells split on "|")."""
    lines = [f"| {' | '.join(map(str, cells))} |" for cells in rows]
    return "\n".join(
        [f"| {header.replace('|', ' | ')} |", "|---" * (header.count("|") + 1) + "|", *lines]
    )


TABLE = (
    "family|variant|acceptance|c=1 tok/s|c=1 / plain|c=2 per stream"
    "|c=2 aggregate (/ plain on batching)"
)


def table(results: Mapping[str, Any]) -> str:
    """One row per family and variant, then the family's routed row."""
    rows = []
    for family, r in results.items():
        plain, batching = r["c1"][PLAIN]["tps"], (r.get("c2_batching") or {}).get("aggregate_tps")
        for variant, cell in r["c1"].items():
            c2 = r["c2"].get(variant) or {}
            speedup = fmt(ratio(cell["tps"], plain))
            cells = [_acceptance(cell), _tps(cell["tps"]), speedup, _tps(c2.get("tps"))]
            rows.append([family, variant, *cells, _aggregate(c2, batching)])
        routed, routed2 = r["routed"], r.get("routed_c2") or {}
        via = f"**routed** ({', '.join(routed['lanes'])}; {', '.join(routed['sources'])})"
        verdicts = [
            f"{a.get('source')}: {a['state']} ({a['reason']})" for a in r.get("auto_disable", [])
        ]
        speedup = f"**{fmt(ratio(routed['tps'], _plain_beside_routed(r)))}**"
        cells = [", ".join(verdicts) or "-", _tps(routed["tps"]), speedup, _tps(routed2.get("tps"))]
        rows.append([family, via, *cells, _aggregate(routed2, batching)])
    return _markdown(TABLE, rows)


def _at_least(value: float | None, bound: float) -> bool | None:
    return None if value is None else value >= bound


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
    prediction, lookup = c1(PREDICTION_FAMILY, "prediction"), c1("edit", "prompt_lookup")
    return {
        "prediction_on_edits": prediction,
        "prompt_lookup_on_edits": lookup,
        "routed_over_plain": routed,
        "met": {
            "prediction>=2.0": _at_least(prediction, 2.0),
            "prompt_lookup>=1.5": _at_least(lookup, 1.5),
            "routed>=0.95 everywhere": _at_least(worst, 0.95),
        },
    }


def scenario_table(results: Mapping[str, Any]) -> str:
    """The ``--scenarios`` part (``plan.SCENARIO_VARIANTS``)."""
    rows = []
    for name, cells in results.items():
        for variant, cell in cells.items():
            speedup = fmt(ratio(cell["tps"], cells[PLAIN]["tps"]))
            figures = [cell.get("forced", 0), _tps(cell["tps"]), speedup]
            rows.append([name, variant, _acceptance(cell), *figures])
    return _markdown("scenario|variant|acceptance|forced|tok/s|/ plain", rows)


def scenario_goals(results: Mapping[str, Any]) -> dict[str, Any]:
    """The issue's goals: a repeated prompt's answer >= 2x, constrained answers >= 1.3x."""

    def over(name: str, variant: str) -> float | None:
        cells = results.get(name)
        return ratio(cells[variant]["tps"], cells[PLAIN]["tps"]) if cells else None

    repeat, tool = over("repeat", "suffix"), over("tool-call", "forced")
    schema = over("json-schema", "forced")
    return {
        "repeat_suffix": repeat,
        "near_repeat_suffix": over("near-repeat", "suffix"),
        "tool_call_forced": tool,
        "json_schema_forced": schema,
        "met": {
            "repeat>=2.0": _at_least(repeat, 2.0),
            "tool_call>=1.3": _at_least(tool, 1.3),
            "json_schema>=1.3": _at_least(schema, 1.3),
        },
    }
