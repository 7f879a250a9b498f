"""``speclane bench cold``: the figures of all rounds summed up, and the Markdown report
(pure: synthetic records are enough to test it)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from router.bench.cold.plan import MLX_LM, SPECLANE
from router.bench.common.stats import fmt, percentile, ratio


def median(values: Sequence[float | None]) -> float | None:
    return percentile([v for v in values if v is not None], 50)


def spread(values: Sequence[float | None]) -> dict[str, float | None]:
    real = [v for v in values if v is not None]
    return {
        "median": median(real),
        "min": min(real, default=None),
        "max": max(real, default=None),
        "n": len(real),
    }


def speclane_cold(record: dict[str, Any]) -> float | None:
    """The cold figure of one speclane round: an unloaded model's first request where the
    router loads models on demand, else start-up to the first token."""
    if record.get("mode") == "on-demand":
        value = record.get("on_demand_first_token_s")
    else:
        value = record.get("startup_first_token_s")
    return value if isinstance(value, int | float) else None


def summary(rounds: Sequence[dict[str, Any]]) -> dict[str, Any]:
    ours = [r for r in rounds if r["side"] == SPECLANE]
    theirs = [r for r in rounds if r["side"] == MLX_LM]
    cold = spread([speclane_cold(r) for r in ours])
    mlx_cold = spread([r.get("first_token_s") for r in theirs])
    warm = spread([v for r in ours for v in r.get("warm_ttft_s", [])])
    mlx_warm = spread([v for r in theirs for v in r.get("warm_ttft_s", [])])
    difference = (
        None
        if warm["median"] is None or mlx_warm["median"] is None
        else (warm["median"] - mlx_warm["median"]) * 1000
    )
    return {
        "speclane_cold_s": cold,
        "speclane_startup_first_token_s": spread([r.get("startup_first_token_s") for r in ours]),
        "speclane_startup_s": spread([r.get("startup_s") for r in ours]),
        "speclane_on_demand_first_token_s": spread(
            [r.get("on_demand_first_token_s") for r in ours]
        ),
        "mlx_lm_server_cold_s": mlx_cold,
        "cold_ratio": ratio(cold["median"], mlx_cold["median"]),
        "speclane_warm_ttft_s": warm,
        "mlx_lm_server_warm_ttft_s": mlx_warm,
        "warm_ttft_difference_ms": difference,
        "router_overhead_ms": spread([v for r in ours for v in r.get("overhead_ms", [])]),
        "errors": [f"round {r['round']} {r['side']}: {e}" for r in rounds for e in r["errors"]],
    }


def _cell(s: dict[str, Any], scale: float = 1.0, digits: int = 2) -> str:
    if s["median"] is None:
        return "-"
    pattern = f"{{:.{digits}f}}"
    middle = fmt(s["median"] * scale, pattern)
    if s["n"] < 2:
        return middle
    return f"{middle} ({fmt(s['min'] * scale, pattern)}-{fmt(s['max'] * scale, pattern)})"


def table(report: dict[str, Any]) -> str:
    s = report["summary"]
    cold_label = (
        "cold request, load included (s): speclane an unloaded model's first request; "
        "mlx_lm.server process start to first token"
        if report["mode"] == "on-demand"
        else "cold start to first token (s): process start, load, first request"
    )
    lines = [
        f"| measure (median, min-max over {report['rounds']} rounds) | speclane | "
        "mlx_lm.server | speclane / mlx_lm.server |",
        "|---|---:|---:|---:|",
        f"| {cold_label} | {_cell(s['speclane_cold_s'])} | "
        f"{_cell(s['mlx_lm_server_cold_s'])} | {fmt(s['cold_ratio'])} |",
    ]
    if report["mode"] == "on-demand":
        lines.append(
            "| speclane start-up to first token on the model loaded at start (s) | "
            f"{_cell(s['speclane_startup_first_token_s'])} | | |"
        )
    warm_ratio = ratio(
        s["speclane_warm_ttft_s"]["median"], s["mlx_lm_server_warm_ttft_s"]["median"]
    )
    lines += [
        f"| speclane start-up until it listens (s) | {_cell(s['speclane_startup_s'])} | | |",
        f"| warm request TTFT (ms) | {_cell(s['speclane_warm_ttft_s'], 1000, 1)} | "
        f"{_cell(s['mlx_lm_server_warm_ttft_s'], 1000, 1)} | "
        f"{fmt(warm_ratio)} |",
        f"| router overhead on a warm request, X-Speclane-Overhead-Ms (ms) | "
        f"{_cell(s['router_overhead_ms'], 1, 3)} | | |",
    ]
    return "\n".join(lines)


def per_round(report: dict[str, Any]) -> str:
    lines = [
        "| round | side | cold s | start-up to first token s | listening s | warm TTFT ms |",
        "|---:|---|---:|---:|---:|---|",
    ]
    for r in report["rounds_detail"]:
        ours = r["side"] == SPECLANE
        cold = speclane_cold(r) if ours else r.get("first_token_s")
        warm = ", ".join(fmt(v * 1000, "{:.0f}") for v in r.get("warm_ttft_s", []))
        lines.append(
            f"| {r['round']} | {r['side']} | {fmt(cold)} | "
            f"{fmt(r.get('startup_first_token_s') if ours else r.get('first_token_s'))} | "
            f"{fmt(r.get('startup_s'))} | {warm or '-'} |"
        )
    return "\n".join(lines)


def markdown(report: dict[str, Any]) -> str:
    env = report["environment"]
    versions = ", ".join(f"{k} {v}" for k, v in env["versions"].items() if v)
    hw = env["hardware"]
    s = report["summary"]
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
