"""Draft length per step (``router.worker.drafting.draftcontrol``) against the two ways it replaces:
plain decoding, and always drafting the longest (``draft_position_cost = 0``), on the
batching lane's engine in-process, one sequence at a time, agent-shaped prompts (the agent
benchmark's long system prompt and its questions, whose answers copy little of it).

    python examples/bench_pacing.py [--rounds 2] [--max-tokens 48] [--out FILE]

Each question is answered three ways in turn (greedy, so the three answers are the same
tokens): ``plain`` (``num_draft_tokens: 0``), ``longest`` (prompt lookup, every step the
longest draft), ``paced`` (prompt lookup, each step's length chosen, the cost of a
position measured). Decode tok/s = (tokens - 1) / (last token - first token). Writes the
raw figures (JSON) and a Markdown table beside them.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import platform
import subprocess
import time
from pathlib import Path
from typing import Any

from router.bench.common import environment, workload
from router.lanes.modelprep import ensure_default_models
from router.worker.drafting.draftcontrol import PassCost
from router.worker.drafting.draftlength import BatchDraftSettings
from router.worker.engines.batching import BatchingEngine
from router.worker.engines.engine import Models
from router.worker.engines.jobs import Failed, Finished, Job, TextDelta
from router.worker.request.protocol import GenerationRequest, Message

WAYS: dict[str, tuple[float | None, dict[str, Any]]] = {
    "plain": (None, {"num_draft_tokens": 0}),
    "longest": (0.0, {"draft_source": "prompt_lookup"}),
    "paced": (None, {"draft_source": "prompt_lookup"}),
}


async def answer(
    engine: BatchingEngine, system: str, question: str, max_tokens: int, **fields: Any
) -> dict[str, Any]:
    assert engine.models is not None
    tokenizer = engine.models.tokenizer
    messages = [{"role": "system", "content": system}, {"role": "user", "content": question}]
    text = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    request = GenerationRequest(
        kind="chat",
        messages=(Message("user", question),),
        temperature=0.0,
        max_tokens=max_tokens,
        **fields,
    )
    prompt = list(tokenizer.encode(text, add_special_tokens=False))
    job = Job(request, prompt, asyncio.get_running_loop(), partition="bench")
    engine.submit(job)
    times: list[float] = []
    while True:
        event = await asyncio.wait_for(job.events.get(), 600)
        if isinstance(event, TextDelta):
            times.append(time.perf_counter())
        elif isinstance(event, Failed):
            raise RuntimeError(event.error.message)
        elif isinstance(event, Finished):
            spec = event.usage.get("speclane_spec") or {}
            tokens = int(event.usage["completion_tokens"])
            span = times[-1] - times[0] if len(times) > 1 else 0.0
            return {
                "tokens": tokens,
                "decode_tok_s": (tokens - 1) / span if span > 0 else None,
                "drafted": spec.get("drafted", 0),
                "accepted": spec.get("accepted", 0),
            }


async def measure(engine: BatchingEngine, args: argparse.Namespace) -> list[dict[str, Any]]:
    system = workload.system_prompt(args.system_tokens, f"{workload.AGENT} Follow these rules.")
    await answer(engine, system, "Hello.", 2, num_draft_tokens=0)  # caches the system prompt
    rows = []
    measured = engine.pass_cost
    for round_ in range(args.rounds):
        for question in workload.QUESTIONS:
            row: dict[str, Any] = {"round": round_ + 1, "question": question}
            for way, (cost, fields) in WAYS.items():
                engine.pass_cost = measured if cost is None else PassCost(cost)
                row[way] = await answer(engine, system, question, args.max_tokens, **fields)
            engine.pass_cost = measured
            rows.append(row)
            print(
                f"{question[:40]:40} "
                + " | ".join(f"{w} {fmt(row[w]['decode_tok_s'])} tok/s" for w in WAYS),
                flush=True,
            )
    return rows


def fmt(value: float | None) -> str:
    return "-" if value is None else f"{value:.1f}"


def summary(rows: list[dict[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for way in WAYS:
        rates = [r[way]["decode_tok_s"] for r in rows if r[way]["decode_tok_s"]]
        out[way] = {
            "mean_decode_tok_s": sum(rates) / len(rates) if rates else None,
            "drafted": sum(r[way]["drafted"] for r in rows),
            "accepted": sum(r[way]["accepted"] for r in rows),
        }
    plain = out["plain"]["mean_decode_tok_s"]
    for way in WAYS:
        mean = out[way]["mean_decode_tok_s"]
        out[way]["vs_plain"] = mean / plain if mean and plain else None
    return out


def markdown(report: dict[str, Any]) -> str:
    lines = [
        "# Draft length per step: paced against plain and the longest drafts",
        "",
        f"`python examples/bench_pacing.py`, {report['date']}, commit {report['commit']}, "
        f"{report['rounds']} rounds of {len(workload.QUESTIONS)} questions, "
        f"{report['max_tokens']} tokens each, system prompt of about "
        f"{report['system_tokens']} tokens; {report['machine']}; load average before "
        f"{report['load_before']}, after {report['load_after']}. The cost of a position "
        f"measured by the paced runs: {report['measured_cost']}.",
        "",
        "| way | mean decode tok/s | vs plain | drafted | accepted |",
        "| --- | ---: | ---: | ---: | ---: |",
    ]
    for way, s in report["summary"].items():
        ratio = "-" if s["vs_plain"] is None else f"{s['vs_plain']:.2f}x"
        lines.append(
            f"| {way} | {fmt(s['mean_decode_tok_s'])} | {ratio} | {s['drafted']} | "
            f"{s['accepted']} |"
        )
    lines += ["", "| round | question | " + " | ".join(WAYS) + " |", "| ---" * 5 + " |"]
    for r in report["rows"]:
        cells = [
            f"{fmt(r[w]['decode_tok_s'])} ({r[w]['accepted']}/{r[w]['drafted']})" for w in WAYS
        ]
        lines.append(f"| {r['round']} | {r['question'][:48]} | " + " | ".join(cells) + " |")
    lines += ["", "Cells: decode tok/s (accepted/drafted)."]
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--max-tokens", type=int, default=48)
    parser.add_argument("--system-tokens", type=int, default=1000)
    parser.add_argument("--out", type=Path, default=Path("examples/results/pacing.json"))
    args = parser.parse_args()
    model_dir = ensure_default_models(quiet=True)[0]

    def load_models() -> Models:
        from mlx_lm import load

        model, tokenizer = load(str(model_dir))
        return Models(model, tokenizer)

    engine = BatchingEngine(load_models, 8, drafts=BatchDraftSettings())
    engine.start()
    load_before = environment.load_average()
    try:
        rows = asyncio.run(measure(engine, args))
    finally:
        engine.stop(30)
    commit = subprocess.run(
        ["git", "describe", "--always", "--dirty", "--exclude=*"], capture_output=True, text=True
    ).stdout.strip()
    report = {
        "date": environment.now_iso(),
        "commit": commit,
        "machine": f"{platform.machine()}, {environment.hardware().get('cpus')} CPUs",
        "load_before": load_before,
        "load_after": environment.load_average(),
        "rounds": args.rounds,
        "max_tokens": args.max_tokens,
        "system_tokens": args.system_tokens,
        "measured_cost": engine.pass_cost.report()["draft_position_cost"],
        "rows": rows,
        "summary": summary(rows),
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=1) + "\n", encoding="utf-8")
    args.out.with_suffix(".md").write_text(markdown(report), encoding="utf-8")
    print(markdown(report))


if __name__ == "__main__":
    main()
