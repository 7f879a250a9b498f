"""PNG charts of a scorecard run (matplotlib, the optional ``plot`` extra): TTFT and tokens
per second by concurrency (each point pools every family of a scenario at a level), and
acceptance per prompt family against the floor."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from router.bench.scorecard.records import levels, pooled
from router.bench.scorecard.report import Result
from router.bench.scorecard.score import Evaluation

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


def write_charts(result: Result, ev: Evaluation, out_dir: Path) -> list[str]:
    """Write the charts; returns their file names. Raises PlotUnavailable without
    matplotlib."""
    plt = _pyplot()
    title = f"{result.model or 'model'} / draft {result.draft or '?'}"
    names = []
    for name, draw in (
        ("ttft_by_concurrency.png", _ttft),
        ("tps_by_concurrency.png", _tps),
        ("acceptance_by_family.png", _acceptance),
    ):
        fig = draw(plt, result, ev, title)
        if fig is None:
            continue
        fig.savefig(out_dir / name, dpi=110, bbox_inches="tight")
        plt.close(fig)
        names.append(name)
    return names


def _series(result: Result, scenario: str, figure: str) -> list[tuple[int, float]]:
    """(concurrency, figure) of a scenario, every family pooled, where it was measured."""
    pooled_ = ((c, pooled(result.runs, scenario, concurrency=c)) for c in levels(result.runs))
    return [
        (c, value)
        for c, s in pooled_
        if s is not None and s.ok and (value := getattr(s, figure)) is not None
    ]


def _lines(ax: Any, result: Result, figures: dict[str, str]) -> bool:
    """One line per scenario and figure (``figures``: field -> label suffix, the first solid,
    the others dashed in the same colour); whether anything was drawn."""
    drawn = False
    for scenario in result.plan.scenarios:
        color = None
        for i, (figure, suffix) in enumerate(figures.items()):
            if points := _series(result, scenario, figure):
                style = (
                    {"marker": "o"} if i == 0 else {"linestyle": "--", "marker": ".", "alpha": 0.7}
                )
                (line,) = ax.plot(
                    *zip(*points, strict=True), color=color, label=f"{scenario}{suffix}", **style
                )
                color, drawn = line.get_color(), True
    return drawn


def _ttft(plt: Any, result: Result, ev: Evaluation, title: str) -> Any:
    fig, ax = plt.subplots(figsize=(7, 4.2))
    if not _lines(ax, result, {"ttft_avg_ms": " avg", "ttft_p95_ms": " p95"}):
        plt.close(fig)
        return None
    _axes(ax, "TTFT (ms)", f"Time to first token by concurrency\n{title}", result)
    return fig


def _tps(plt: Any, result: Result, ev: Evaluation, title: str) -> Any:
    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4.2))
    drawn = _lines(left, result, {"decode_tps_avg": ""})
    if not _lines(right, result, {"agg_tps": ""}) and not drawn:
        plt.close(fig)
        return None
    _axes(left, "decode tok/s per request", "Decode speed per request", result)
    _axes(right, "aggregate tok/s", "Aggregate throughput", result)
    fig.suptitle(f"Tokens per second by concurrency - {title}")
    return fig


def _acceptance(plt: Any, result: Result, ev: Evaluation, title: str) -> Any:
    rows = [a for a in ev.acceptance if a.acceptance is not None]
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


def _axes(ax: Any, ylabel: str, title: str, result: Result) -> None:
    ax.set_xscale("log", base=2)
    ticks = levels(result.runs)
    ax.set_xticks(ticks)
    ax.set_xticklabels([str(t) for t in ticks])
    ax.set_xlabel("concurrency")
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=8)
