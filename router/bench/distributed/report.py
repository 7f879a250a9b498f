"""The distributed benchmark's table: each target's decode rate and its ratio to
``mlx_lm.server`` on the same group."""

from __future__ import annotations

from statistics import median
from typing import Any

from router.bench.distributed.run import PLAIN, TARGETS


def rates(results: dict[str, Any]) -> dict[str, float | None]:
    out: dict[str, float | None] = {}
    for target in TARGETS:
        values = [
            r["decode_tok_s"]
            for r in results["runs"]
            if r["target"] == target and r["decode_tok_s"] is not None and not r["error"]
        ]
        if any(r["target"] == target for r in results["runs"]):
            out[target] = median(values) if values else None
    return out


def render(results: dict[str, Any]) -> str:
    table = rates(results)
    base = table.get(PLAIN)
    texts = {r["text"] for r in results["runs"] if not r["error"]}
    lines = [
        f"{len(results['hosts'])} ranks on {', '.join(sorted(set(results['hosts'])))} "
        f"({results['backend']}, {results['parallel']} parallel), {results['model']}, "
        f"one copy-heavy stream, {results['max_tokens']} tokens at most, greedy",
        "",
        "| target | tokens | decode tok/s (after the first token) | x mlx_lm.server "
        "| drafted / accepted |",
        "| --- | --- | --- | --- | --- |",
    ]
    for run in results["runs"]:
        rate = run["decode_tok_s"]
        ratio = f"{rate / base:.2f}x" if rate and base else "-"
        spec = run.get("spec") or {}
        drafts = f"{spec.get('drafted', 0)} / {spec.get('accepted', 0)}" if spec else "-"
        shown = "-" if rate is None else f"{rate:.2f}"
        lines.append(
            f"| {run['target']} | {run['completion_tokens']} | {shown} | {ratio} | {drafts} |"
        )
    lines += [
        "",
        "every target wrote the same text" if len(texts) == 1 else "the targets' texts DIFFER",
    ]
    return "\n".join(lines)


def markdown(results: dict[str, Any]) -> str:
    return (
        "# speclane bench distributed\n\n"
        + render(results)
        + "\n\nRanks sharing one CPU measure the group protocol's overhead and the passes a "
        "draft saves, not a link between machines.\n"
    )
