"""Does speculation pay on this machine, per kind of content and draft source? And what did
auto-disable decide?

    python examples/spec_families.py [--draft-source prompt_lookup|draft_model]
        [--families chat,code,list,edit,refactor-with-prediction] [--requests 6]
        [--max-tokens 48] [--edit-max-tokens 160] [--out FILE]

Starts speclane with both lanes on the default model (or attaches with --url, which then
needs the three family policies below in its policies_dir). Each prompt family is sent as
its own client (X-Speclane-Client: family-<name>), so each is its own auto-disable workload.
Per family: plain decoding on the speculative lane (num_draft_tokens 0), speculative
decoding on the same lane, then requests the router routes by itself; finally the
workload's state from GET /admin/spec. Decode speed = (tokens - 1) / (last - first token).

The speculative lane drafts with ``--draft-source`` (``[lanes] draft_source``); the family
``refactor-with-prediction`` carries the original function as its ``prediction``, which the
lane drafts from whatever its source (``router/bench/edits.py``).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import sys
import tempfile
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp

from router.bench import procs
from router.bench.edits import EDIT_FAMILIES, edit_body
from router.bench.stats import mean

FAMILIES = {
    "chat": "Tell me about your favourite season and why you like it.",
    "code": "Write a Python function that checks whether a string is a palindrome.",
    "list": "Count from 1 to 40, separated by commas.",
    **{name: "" for name in EDIT_FAMILIES},  # bodies from router.bench.edits
}
CONFIG = """
policies_dir = "{tmp}/policies"
log_level = "warning"
[lanes]
draft_source = "{source}"
[spec]
window_size = 96
min_sample = 48
speed_window = 8
min_speed_samples = 3
min_decode_tokens = 8
baseline_spacing = 5
probe_min_spacing = 600
probe_initial = 600
probe_max = 1200
"""
POLICY = """client = "family-{name}"
allow_lane_override = true
[match]
client_header = ["family-{name}"]
"""


async def one(session: aiohttp.ClientSession, url: str, family: str, prompt: str,
              max_tokens: int, lane: str | None, drafts: int | None) -> dict[str, Any]:
    headers = {"X-Speclane-Client": f"family-{family}"}
    if lane:
        headers["X-Speclane-Lane"] = lane
    body: dict[str, Any] = {"model": "SmolLM2-135M-Instruct", "max_tokens": max_tokens,
                            "temperature": 0, "stream": True,
                            "stream_options": {"include_usage": True},
                            "messages": [{"role": "user", "content": prompt}]}
    endpoint = "chat/completions"
    if family in EDIT_FAMILIES:
        endpoint = "completions"
        del body["messages"]
        body.update(edit_body(family))
    if drafts is not None:
        body["num_draft_tokens"] = drafts
    first = last = None
    usage: dict[str, Any] = {}
    async with session.post(f"{url}/{endpoint}", json=body, headers=headers) as resp:
        chosen = resp.headers.get("X-Speclane-Lane")
        async for raw in resp.content:
            line = raw.strip()
            if not line.startswith(b"data: {"):
                continue
            event = json.loads(line[6:])
            choice = (event.get("choices") or [{}])[0]
            if choice.get("text") or (choice.get("delta") or {}).get("content"):
                last = time.perf_counter()
                first = first or last
            if event.get("usage"):
                usage = event["usage"]
    tokens = usage.get("completion_tokens", 0)
    tps = (tokens - 1) / (last - first) if first and last and last > first and tokens > 1 else None
    cached = (usage.get("prompt_tokens_details") or {}).get("cached_tokens")
    return {"lane": chosen, "tokens": tokens, "tps": tps, "spec": usage.get("speclane_spec"),
            "cached": cached}


def summarise(runs: list[dict[str, Any]]) -> dict[str, Any]:
    drafted = sum((r["spec"] or {}).get("drafted", 0) for r in runs)
    accepted = sum((r["spec"] or {}).get("accepted", 0) for r in runs)
    sources = sorted({str((r["spec"] or {}).get("source")) for r in runs})
    return {"tps": mean([r["tps"] for r in runs if r["tps"]]), "drafted": drafted,
            "accepted": accepted, "acceptance": accepted / drafted if drafted else None,
            "lanes": sorted({r["lane"] for r in runs}), "sources": sources,
            "tokens": [r["tokens"] for r in runs]}


@contextlib.asynccontextmanager
async def router(url: str | None, source: str) -> AsyncIterator[str]:
    if url:
        yield url
        return
    with tempfile.TemporaryDirectory(prefix="speclane-families-") as tmp:
        (Path(tmp) / "policies").mkdir()
        for name in FAMILIES:
            (Path(tmp) / "policies" / f"family-{name}.toml").write_text(POLICY.format(name=name))
        config = Path(tmp) / "speclane.toml"
        config.write_text(CONFIG.format(tmp=tmp, source=source))
        proc, m = await procs.spawn_until_line(
            [sys.executable, "-m", "router", "serve", "--config", str(config), "--port", "0"],
            r"listening on (http://\S+)", deadline=600)
        try:
            yield m.group(1)
        finally:
            await procs.stop(proc)


async def run(args: argparse.Namespace) -> dict[str, Any]:
    results: dict[str, Any] = {}
    timeout = aiohttp.ClientTimeout(total=600)
    async with router(args.url, args.draft_source) as url, \
            aiohttp.ClientSession(timeout=timeout) as session:
        for family in args.families:
            prompt = FAMILIES[family]
            tokens = args.edit_max_tokens if family in EDIT_FAMILIES else args.max_tokens
            plain, spec, auto = [], [], []
            for _ in range(args.requests):  # interleaved, so drift hits both alike
                plain.append(await one(session, url, family, prompt, tokens, "speculative", 0))
                spec.append(await one(session, url, family, prompt, tokens, "speculative", None))
            for _ in range(args.requests):
                auto.append(await one(session, url, family, prompt, tokens, None, None))
            results[family] = {"plain": summarise(plain), "speculative": summarise(spec),
                               "auto": summarise(auto)}
            print(f"  {family}: done", flush=True)
        async with session.get(url.removesuffix("/v1") + "/admin/spec") as resp:
            spec_state = await resp.json()
    for row in spec_state["workloads"]:
        family = row["workload"].split(":")[0].removeprefix("family-")
        if family in results and row["backend"] == "speculative":
            results[family]["auto_disable"] = {
                "state": row["state"], "reason": row["reason"],
                "window_acceptance": row["window"]["acceptance"],
                "spec_tps": row["speed"]["spec_tps"], "baseline_tps": row["speed"]["baseline_tps"]}
    return results


def table(results: dict[str, Any]) -> str:
    def f(v: Any, spec: str = ".2f") -> str:
        return "-" if v is None else format(v, spec)

    lines = ["| family | source | acceptance | spec tok/s | plain tok/s | spec/plain | "
             "auto-disable | routed to | routed tok/s (/plain) |",
             "|---|---|---|---|---|---|---|---|---|"]
    for family, r in results.items():
        s, p, a = r["speculative"], r["plain"], r["auto"]
        ratio = s["tps"] / p["tps"] if s["tps"] and p["tps"] else None
        auto_ratio = a["tps"] / p["tps"] if a["tps"] and p["tps"] else None
        ad = r.get("auto_disable", {})
        lines.append(f"| {family} | {', '.join(s['sources'])} | {f(s['acceptance'])} "
                     f"({s['accepted']}/{s['drafted']}) | "
                     f"{f(s['tps'], '.1f')} | {f(p['tps'], '.1f')} | {f(ratio)} | "
                     f"{ad.get('state', '-')} ({ad.get('reason', '-')}) | "
                     f"{', '.join(a['lanes'])} | {f(a['tps'], '.1f')} ({f(auto_ratio)}) |")
    return "\n".join(lines)


def _commit() -> str | None:
    import subprocess

    with contextlib.suppress(OSError, subprocess.SubprocessError):
        out = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True,
                             text=True, cwd=Path(__file__).parent, timeout=10)
        return out.stdout.strip() or None
    return None


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--url", help="an already running speclane (with the family policies)")
    p.add_argument("--requests", type=int, default=6)
    p.add_argument("--max-tokens", type=int, default=48)
    p.add_argument("--edit-max-tokens", type=int, default=160)
    p.add_argument("--draft-source", choices=("prompt_lookup", "draft_model"),
                   default="prompt_lookup", help="the speculative lane's [lanes] draft_source")
    p.add_argument("--families", type=lambda v: [f for f in v.split(",") if f],
                   default=list(FAMILIES), help="comma-separated, of: " + ", ".join(FAMILIES))
    p.add_argument("--out", type=Path, default=Path("bench-results/spec-families.json"))
    args = p.parse_args()
    unknown = set(args.families) - set(FAMILIES)
    if unknown:
        p.error(f"unknown families: {', '.join(sorted(unknown))}")
    results = asyncio.run(run(args))
    print(table(results))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    meta = {"draft_source": args.draft_source, "requests": args.requests,
            "max_tokens": args.max_tokens, "edit_max_tokens": args.edit_max_tokens,
            "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
            "commit": _commit(), "table": table(results).split("\n")}
    args.out.write_text(json.dumps({"meta": meta, "families": results}, indent=2))
    print(f"saved {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
