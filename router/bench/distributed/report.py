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


NOTES = """
What this measures: every rank runs on this one machine and they share its cores, so a step's
cost is mostly the ranks waiting for one another in the collectives of each layer (the
protocol's overhead and the CPU contention), not a link between machines. The targets run one
after the other (`mlx_lm.server` first, then speclane), so a shared machine's load differs
between them: `speclane:plain` (the same group, the same lane, no draft) against the drafting
targets is the draft's own effect; against `mlx_lm.server` the difference in load weighs in
too. Decode rates are after the first token (a plain step on every target); `drafted /
accepted` are the lane's `usage.speclane_spec` counts.
"""


def markdown(results: dict[str, Any]) -> str:
    env = results.get("environment") or {}
    load = env.get("load_average")
    after = [r.get("load_average") for r in results["runs"] if r.get("load_average")]
    when = results.get("environment_at", "end")  # the first run recorded it at the end
    lines = [f"load average at the {when} of the run: {load}"] if load else []
    if after:
        lines.append(f"load average after each stream: {after}")
    return (
        "# speclane bench distributed\n\n"
        + render(results)
        + ("\n\n" + "\n".join(lines) if lines else "")
        + "\n"
        + NOTES
    )
