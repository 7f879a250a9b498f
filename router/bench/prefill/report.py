"""``speclane bench prefill``: the table of every request, side by side (pure)."""

from __future__ import annotations

from typing import Any

from router.bench.common.stats import fmt

COLUMNS = ("prompt", "cached", "prefilled", "ideal new", "TTFT s")


def rows(results: dict[str, Any]) -> list[list[str]]:
    out = []
    for target, records in results.get("targets", {}).items():
        for r in records:
            if "step" not in r:
                out.append([target, "(failed)", r.get("error") or "", "", "", "", ""])
                continue
            ideal = r.get("ideal_new_tokens")
            step = f"{r['step']}{' (restarted)' if r.get('restarted_before') else ''}"
            out.append(
                [
                    target,
                    step,
                    _int(r.get("prompt_tokens")),
                    _int(r.get("cached_tokens")),
                    _int(r.get("prefilled_tokens")),
                    _int(ideal),
                    fmt(r.get("ttft_s")),
                ]
            )
    return out


def _int(value: Any) -> str:
    return f"{value:,}" if isinstance(value, int) else "-"


def render(results: dict[str, Any]) -> str:
    header = ["target", "step", *COLUMNS]
    table = [header, *rows(results)]
    widths = [max(len(row[i]) for row in table) for i in range(len(header))]
    return "\n".join(
        "  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)) for row in table
    )


def markdown(results: dict[str, Any]) -> str:
    env = results.get("environment", {})
    load = env.get("load_average_before"), env.get("load_average_after")
    lines = [
        "# speclane bench prefill",
        "",
        f"{results.get('date')}, commit {results.get('commit')}, model {results.get('model')}; "
        f"load average before/after {load[0]} / {load[1]} (a busy machine inflates the "
        "seconds; the token counts do not depend on it).",
        "",
        "| target | step | " + " | ".join(COLUMNS) + " |",
        "|---|---|" + "---:|" * len(COLUMNS),
    ]
    lines += ["| " + " | ".join(row) + " |" for row in rows(results)]
    return "\n".join(lines) + "\n"
