"""Decode speed of the two MLX lanes on the default model, with and without speculation.

    python examples/bench_lanes.py --out lanes.json [--max-tokens 64] [--concurrency 4]

Starts one speculative and one batching worker (real processes, OpenBLAS preloaded as the
supervisor does), streams a few greedy prompts through each, and prints per scenario the
decode rate (tokens after the first / time from first to last chunk, so prompt processing is
excluded), the time to first token and, for speculation, the acceptance rate
(accepted / drafted from the worker's ``usage.speclane_spec``). A measurement, not a test.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import platform
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import aiohttp

from router.kernel.worker_contract import READY_PREFIX
from router.lanes.blas import openblas_path, preload_env
from router.lanes.modelprep import ensure_default_models

PROMPTS = {
    "fact": "What is the capital of France? Answer in two sentences.",
    "code": "Write a Python function that checks whether a string is a palindrome.",
    "count": "Count from 1 to 40, separated by commas.",
}


def start_worker(args: list[str]) -> tuple[subprocess.Popen[str], str]:
    cmd = [sys.executable, "-m", "router.worker", *args]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True, env=preload_env())
    assert proc.stdout is not None
    line = proc.stdout.readline()
    if not line.startswith(READY_PREFIX):
        proc.kill()
        raise SystemExit(f"worker did not start: {' '.join(cmd)}")
    port = json.loads(line.split(" ", 1)[1])["port"]
    return proc, f"http://127.0.0.1:{port}"


async def stream_one(
    session: aiohttp.ClientSession, url: str, prompt: str, max_tokens: int, extra: dict[str, Any]
) -> dict[str, Any]:
    body = {
        "messages": [{"role": "user", "content": prompt}],
        "max_tokens": max_tokens,
        "temperature": 0,
        "stream": True,
        **extra,
    }
    started = time.perf_counter()
    first = last = None
    usage: dict[str, Any] = {}
    async with session.post(f"{url}/v1/chat/completions", json=body) as response:
        async for raw in response.content:
            line = raw.decode().strip()
            if not line.startswith("data: {"):
                continue
            chunk = json.loads(line[len("data: ") :])
            if chunk["choices"] and chunk["choices"][0]["delta"].get("content"):
                first = first or time.perf_counter()
                last = time.perf_counter()
            usage = chunk.get("usage") or usage
    tokens = usage["completion_tokens"]
    decode_s = (last - first) if first and last else 0.0
    spec = usage["speclane_spec"]
    return {
        "completion_tokens": tokens,
        "ttft_s": round((first or started) - started, 3),
        "decode_tok_s": round((tokens - 1) / decode_s, 2) if decode_s > 0 else None,
        "drafted": spec["drafted"],
        "accepted": spec["accepted"],
        "steps": spec["steps"],
    }


async def scenario(
    name: str, url: str, max_tokens: int, extra: dict[str, Any], concurrency: int = 1
) -> list[dict[str, Any]]:
    rows = []
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=1800)) as session:
        for label, prompt in PROMPTS.items():
            started = time.perf_counter()
            runs = await asyncio.gather(
                *(stream_one(session, url, prompt, max_tokens, extra) for _ in range(concurrency))
            )
            wall = time.perf_counter() - started
            row = {"scenario": name, "prompt": label, "concurrency": concurrency, **runs[0]}
            if concurrency > 1:
                row["aggregate_tok_s"] = round(sum(r["completion_tokens"] for r in runs) / wall, 2)
            rows.append(row)
            print(json.dumps(row), flush=True)
    return rows


def summarise(rows: list[dict[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for name in dict.fromkeys(r["scenario"] for r in rows):
        mine = [r for r in rows if r["scenario"] == name]
        rates = [r["decode_tok_s"] for r in mine if r["decode_tok_s"]]
        drafted = sum(r["drafted"] for r in mine)
        out[name] = {
            "mean_decode_tok_s": round(sum(rates) / len(rates), 2) if rates else None,
            "acceptance": round(sum(r["accepted"] for r in mine) / drafted, 3) if drafted else None,
        }
        if any("aggregate_tok_s" in r for r in mine):
            agg = [r["aggregate_tok_s"] for r in mine]
            out[name]["mean_aggregate_tok_s"] = round(sum(agg) / len(agg), 2)
    return out


async def run(args: argparse.Namespace) -> dict[str, Any]:
    model, draft = ensure_default_models()
    spec, spec_url = start_worker(
        [
            "--mode",
            "speculative",
            "--model",
            str(model),
            "--draft-model",
            str(draft),
            "--num-draft-tokens",
            str(args.num_draft_tokens),
        ]
    )
    batch, batch_url = start_worker(
        ["--mode", "batching", "--model", str(model), "--max-batch-size", str(args.concurrency)]
    )
    try:
        rows = await scenario("speculative lane, draft on", spec_url, args.max_tokens, {})
        rows += await scenario(
            "speculative lane, draft off", spec_url, args.max_tokens, {"num_draft_tokens": 0}
        )
        rows += await scenario("batching lane, 1 request", batch_url, args.max_tokens, {})
        rows += await scenario(
            f"batching lane, {args.concurrency} concurrent",
            batch_url,
            args.max_tokens,
            {},
            concurrency=args.concurrency,
        )
    finally:
        for proc in (spec, batch):
            proc.terminate()
            proc.wait(30)
    return {
        "machine": {"platform": platform.platform(), "cpu": platform.processor() or None},
        "openblas": openblas_path(),
        "model": str(model),
        "draft": str(draft),
        "num_draft_tokens": args.num_draft_tokens,
        "max_tokens": args.max_tokens,
        "results": rows,
        "summary": summarise(rows),
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--max-tokens", type=int, default=64)
    p.add_argument("--num-draft-tokens", type=int, default=3)
    p.add_argument("--concurrency", type=int, default=4)
    args = p.parse_args()
    report = asyncio.run(run(args))
    args.out.write_text(json.dumps(report, indent=2) + "\n")
    print(json.dumps(report["summary"], indent=2))


if __name__ == "__main__":
    main()
