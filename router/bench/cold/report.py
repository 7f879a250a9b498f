"""``speclane bench cold``: the figures of all rounds summed up, and the Markdown report
(pure: synthetic records are enough to test it)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from router.bench.cold.plan import MLX_LM, SPECLANE
from router.bench.common import stats
from router.bench.common.stats import fmt, percentile, ratio

COLD_LABEL = {
    "on-demand": "cold request, load included (s): speclane an unloaded model's first request; "
    "mlx_lm.server process start to first token",
    "startup": "cold start to first token (s): process start, load, first request",
}
LOADED_AT_START = "speclane start-up to first token on the model loaded at start (s)"
OVERHEAD = "router overhead on a warm request, X-Speclane-Overhead-Ms (ms)"


def spread(values: Sequence[float | None]) -> dict[str, float | None]:
    real = [v for v in values if v is not None]
    low, high = min(real, default=None), max(real, default=None)
    return {"median": percentile(real, 50), "min": low, "max": high, "n": len(real)}


def speclane_cold(record: dict[str, Any]) -> float | None:
    """The cold figure of one speclane round: an unloaded model's first request where the
    router loads models on demand, else start-up to the first token."""
    on_demand = record.get("mode") == "on-demand"
    value = record.get("on_demand_first_token_s" if on_demand else "startup_first_token_s")
    return value if isinstance(value, int | float) else None


def summary(rounds: Sequence[dict[str, Any]]) -> dict[str, Any]:
    ours = [r for r in rounds if r["side"] == SPECLANE]
    theirs = [r for r in rounds if r["side"] == MLX_LM]

    def each(side: list[dict[str, Any]], key: str) -> dict[str, float | None]:
        return spread([r.get(key) for r in side])

    def every(side: list[dict[str, Any]], key: str) -> dict[str, float | None]:
        return spread([v for r in side for v in r.get(key, [])])

    cold, mlx_cold = spread([speclane_cold(r) for r in ours]), each(theirs, "first_token_s")
    warm, mlx_warm = every(ours, "warm_ttft_s"), every(theirs, "warm_ttft_s")
    ours_s, theirs_s = warm["median"], mlx_warm["median"]
    difference = None if ours_s is None or theirs_s is None else (ours_s - theirs_s) * 1000
    return {
        "speclane_cold_s": cold,
        "speclane_startup_first_token_s": each(ours, "startup_first_token_s"),
        "speclane_startup_s": each(ours, "startup_s"),
        "speclane_on_demand_first_token_s": each(ours, "on_demand_first_token_s"),
        "mlx_lm_server_cold_s": mlx_cold,
        "cold_ratio": ratio(cold["median"], mlx_cold["median"]),
        "speclane_warm_ttft_s": warm,
        "mlx_lm_server_warm_ttft_s": mlx_warm,
        "warm_ttft_difference_ms": difference,
        "router_overhead_ms": every(ours, "overhead_ms"),
        "errors": [f"round {r['round']} {r['side']}: {e}" for r in rounds for e in r["errors"]],
    }


def _cell(s: dict[str, Any], scale: float = 1.0, digits: int = 2) -> str:
    """The median, and the range when there are several values."""
    if s["median"] is None:
        return "-"
    middle, low, high = (fmt(s[k] * scale, f"{{:.{digits}f}}") for k in ("median", "min", "max"))
    return middle if s["n"] < 2 else f"{middle} ({low}-{high})"


def table(report: dict[str, Any]) -> str:
    """The medians and ranges, speclane beside mlx_lm.server."""
    s = report["summary"]
    ours, theirs = s["speclane_warm_ttft_s"], s["mlx_lm_server_warm_ttft_s"]
    cold = [_cell(s["speclane_cold_s"]), _cell(s["mlx_lm_server_cold_s"]), fmt(s["cold_ratio"])]
    warm_ratio = fmt(ratio(ours["median"], theirs["median"]))
    rows = [[COLD_LABEL[report["mode"]], *cold]]
    if report["mode"] == "on-demand":
        rows.append([LOADED_AT_START, _cell(s["speclane_startup_first_token_s"]), "", ""])
    rows += [
        ["speclane start-up until it listens (s)", _cell(s["speclane_startup_s"]), "", ""],
        ["warm request TTFT (ms)", _cell(ours, 1000, 1), _cell(theirs, 1000, 1), warm_ratio],
        [OVERHEAD, _cell(s["router_overhead_ms"], 1, 3), "", ""],
    ]
    measure = f"measure (median, min-max over {report['rounds']} rounds)"
    header = [measure, SPECLANE, MLX_LM, "speclane / mlx_lm.server"]
    return "\n".join(stats.table(header, rows, "lrrr"))


def per_round(report: dict[str, Any]) -> str:
    rows = []
    for r in report["rounds_detail"]:
        ours = r["side"] == SPECLANE
        cold = speclane_cold(r) if ours else r.get("first_token_s")
        first = r.get("startup_first_token_s") if ours else r.get("first_token_s")
        warm = ", ".join(fmt(v * 1000, "{:.0f}") for v in r.get("warm_ttft_s", []))
        rows.append(
            [r["round"], r["side"], fmt(cold), fmt(first), fmt(r.get("startup_s")), warm or "-"]
        )
    header = ["round", "side", "cold s", "start-up to first token s", "listening s", "warm TTFT ms"]
    return "\n".join(stats.table(header, rows, "rlrrrl"))


def markdown(report: dict[str, Any]) -> str:
    env, hw, s = report["environment"], report["environment"]["hardware"], report["summary"]
    versions = ", ".join(f"{k} {v}" for k, v in env["versions"].items() if v)
    lines = [
        "# Cold start: speclane against mlx_lm.server",
        "",
        f"`speclane bench cold`, {report['date']}, commit {report['commit']}, mode "
        f"`{report['mode']}`, {report['rounds']} rounds interleaved, model `{report['model']}`, "
        f"layout `{report['layout']}`, {report['max_tokens']} tokens per request, "
        f"{report['warm']} warm requests per side and round.",
        "",
        f"Machine: {hw.get('cpu')}, {hw.get('cpus')} CPUs, {hw.get('memory_gib')} GiB, MLX "
        f"device {hw.get('mlx_device')}; load average before {env['load_average_before']}, "
        f"after {env['load_average_after']}. {versions}.",
        "",
        table(report),
        "",
        f"Warm TTFT, speclane minus mlx_lm.server: {fmt(s['warm_ttft_difference_ms'], '{:.1f}')} "
        "ms (speclane's own lanes answer it, not mlx_lm.server: the difference is the lanes' "
        "and the router's together; the header is the router's part alone).",
        "",
        per_round(report),
    ]
    if s["errors"]:
        lines += ["", "Errors:", "", *(f"- {e}" for e in s["errors"])]
    return "\n".join(lines) + "\n"
