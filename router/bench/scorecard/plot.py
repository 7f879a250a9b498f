"""PNG charts of a scorecard run (matplotlib, the optional ``plot`` extra): TTFT and tokens
per second by concurrency (each point pools every family of a scenario at a level), and
acceptance per prompt family against the floor."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from router.bench.scorecard.records import levels, pooled
from router.bench.scorecard.report import Result

MISSING = (
    "--plot needs matplotlib, which is not installed: "
    "pip install 'speclane[plot]' (or pip install matplotlib)"
)


class PlotUnavailable(RuntimeError):
    pass


def _pyplot() -> Any:  # matplotlib.pyplot (an optional dependency)
    try:
        import matplotlib
    except ImportError as e:
        raise PlotUnavailable(MISSING) from e
    matplotlib.use("Agg")  # files only: no display needed
    import matplotlib.pyplot as plt

    return plt


def available() -> bool:
    try:
        _pyplot()
    except PlotUnavailable:
        return False
    return True


def write_charts(result: Result, out_dir: Path) -> list[str]:
    """Write the charts that have something to show; their file names. Raises
    PlotUnavailable without matplotlib."""
    plt, env = _pyplot(), result.environment
    title = f"{env.get('model') or 'model'} / draft {env.get('draft_model') or '?'}"
    names = []
    for name, draw in (
        ("ttft_by_concurrency.png", _ttft),
        ("tps_by_concurrency.png", _tps),
        ("acceptance_by_family.png", _acceptance),
    ):
        if (fig := draw(plt, result, title)) is not None:
            fig.savefig(out_dir / name, dpi=110, bbox_inches="tight")
            plt.close(fig)
            names.append(name)
    return names


def _lines(ax: Any, result: Result, figures: dict[str, str], ylabel: str, title: str) -> bool:
    """One line per scenario and figure (``figures``: field -> label suffix, the first solid,
    the others dashed in the same colour), every family pooled; whether anything was drawn."""
    drawn, ticks = False, levels(result.runs)
    for scenario in result.plan.scenarios:
        color = None
        for i, (figure, suffix) in enumerate(figures.items()):
            summaries = [(c, pooled(result.runs, scenario, c)) for c in ticks]
            points = [
                (c, v) for c, s in summaries if s and s.ok and (v := getattr(s, figure)) is not None
            ]
            if points:
                style = (
                    {"marker": "o"} if i == 0 else {"linestyle": "--", "marker": ".", "alpha": 0.7}
                )
                (line,) = ax.plot(
                    *zip(*points, strict=True), color=color, label=f"{scenario}{suffix}", **style
                )
                color, drawn = line.get_color(), True
    ax.set_xscale("log", base=2)
    ax.set_xticks(ticks)
    ax.set_xticklabels([str(t) for t in ticks])
    ax.set_xlabel("concurrency")
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    ax.grid(True, alpha=0.3)
    if drawn:
        ax.legend(fontsize=8)
    return drawn


def _ttft(plt: Any, result: Result, title: str) -> Any:
    fig, ax = plt.subplots(figsize=(7, 4.2))
    figures = {"ttft_avg_ms": " avg", "ttft_p95_ms": " p95"}
    if _lines(ax, result, figures, "TTFT (ms)", f"Time to first token by concurrency\n{title}"):
        return fig
    plt.close(fig)
    return None


def _tps(plt: Any, result: Result, title: str) -> Any:
    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4.2))
    per_request = ("decode tok/s per request", "Decode speed per request")
    drawn = _lines(left, result, {"decode_tps_avg": ""}, *per_request)
    if _lines(right, result, {"agg_tps": ""}, "aggregate tok/s", "Aggregate throughput") or drawn:
        fig.suptitle(f"Tokens per second by concurrency - {title}")
        return fig
    plt.close(fig)
    return None


def _acceptance(plt: Any, result: Result, title: str) -> Any:
    ev = result.evaluation()
    rows = [a for a in ev.acceptance_by_family if a.acceptance is not None]
    if not rows:
        return None
    fig, ax = plt.subplots(figsize=(7, 4.2))
    colors = ["tab:green" if a.passed else "tab:red" for a in rows]
    bars = ax.bar([a.family for a in rows], [a.acceptance for a in rows], color=colors)
    for bar, a in zip(bars, rows, strict=True):
        ax.annotate(
            f"{a.acceptance:.2f}\n{a.accepted}/{a.drafted}",
            (bar.get_x() + bar.get_width() / 2, bar.get_height()),
            ha="center",
            va="bottom",
            fontsize=8,
        )
    floor = ev.thresholds.acceptance_floor
    ax.axhline(floor, color="gray", linestyle="--", label=f"floor {floor:.2f}")
    ax.set_ylim(0, 1.15)
    ax.set_ylabel("accepted / drafted")
    ax.set_title(f"Draft acceptance by prompt family (spec-on)\n{title}")
    ax.legend(loc="upper right", fontsize=8)
    return fig
