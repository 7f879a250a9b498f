"""Does speculation pay on this machine, per kind of content and draft source? And what did
auto-disable decide?

    python examples/spec_families.py [--families chat,code,list,edit,refactor-with-prediction]
        [--requests 3] [--max-tokens 48] [--edit-max-tokens 160] [--settle-max 12] [--out FILE]
        [--scenarios repeat,near-repeat,tool-call,json-schema] [--routed-only]

Starts speclane with both lanes on the default model, `[lanes] draft_source = "auto"` (or
attaches with --url, which then needs the family policies below in its policies_dir). Each
prompt family is sent as its own client (X-Speclane-Client: family-<name>), so each is its
own auto-disable workload. Per family, on the speculative lane: plain decoding
(num_draft_tokens 0) and every draft source (the lane's `draft_source` request field;
`prediction` for the family that carries one), at concurrency 1 (interleaved) and 2; plain
on the batching lane at concurrency 2; then requests without a lane header until
auto-disable has decided (GET /admin/spec), and the routed requests that are measured.
Speed = tokens / (last token - request sent), the prompt cached by a warm-up request
on each lane. The pure parts: router/bench/sources/. The `tool-call` and `json-schema`
families are answers held to a grammar (the router's `constrained` family), each request
about a subject not asked before (`router.bench.sources.plan.SUBJECTS`). `--routed-only`
measures per family only plain decoding and the routed run once auto-disable has decided
(every family's routed ratio in far less time).

`--scenarios` (then `--families ""` skips the families) measures, on the speculative lane
as one client: a repeated prompt and a near-repeat (one name changed) with the `suffix`
source against plain decoding, and constrained answers (a required tool call, a
`json_schema`) with the grammar's forced tokens against plain constrained decoding.

`--scenarios batch-copy` measures drafting on the batching lane: the copy-heavy families
(`refactor-with-prediction` drafting from its prediction, `edit` from prompt lookup) as
BATCH_CONCURRENCY requests at once on the batching lane, drafting against plain decoding
(`num_draft_tokens: 0`), interleaved; aggregate tok/s = the batch's tokens / its wall time.
`--scenarios batch-constrained` does the same with constrained answers (`tool-call`,
`json-schema`: the grammar's forced tokens, chained with the source the router names,
against plain constrained decoding): every round BATCH_CONCURRENCY questions never asked
before, their prompts cached by a one-token request each, the forced variant first, then
the same questions plainly. Per request, decode tok/s = (tokens - 1) / (last token - first).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import itertools
import json
import os
import sys
import tempfile
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp

from router.bench.common import procs, stats
from router.bench.sources import plan, report
from router.bench.sources.plan import EDIT_FAMILIES, edit_body

FAMILIES = {
    "chat": "Tell me about your favourite season and why you like it.",
    "code": "Write a Python function that checks whether a string is a palindrome.",
    "list": "Count from 1 to 40, separated by commas.",
    **{name: "" for name in EDIT_FAMILIES},  # bodies from router.bench.sources.plan
    # answers held to a grammar (the router's ``constrained`` family)
    **{name: plan.constrained_request(name)[0] for name in plan.CONSTRAINED},
}
CONFIG = """
policies_dir = "{tmp}/policies"
log_level = "warning"
[lanes]
draft_source = "auto"
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
SCENARIO_CLIENT = "scenarios"
# How many questions each constrained family has asked (a fresh subject every request).
ASKED = {name: itertools.count() for name in plan.CONSTRAINED}
# Drafting on the batching lane: (family, the source it drafts with), BATCH_CONCURRENCY at once.
BATCH_SCENARIOS = {
    "batch-copy": (("refactor-with-prediction", "prediction"), ("edit", "prompt_lookup")),
    "batch-constrained": (("tool-call", "forced"), ("json-schema", "forced")),
}
BATCH_CONCURRENCY = 4
REPEAT_PROMPT = (
    "Write a Python class named {name} with methods add(item), remove(item) and "
    "total() for a shopping cart, with a docstring for each method."
)
NAMES = [
    "ShoppingCart",
    "Basket",
    "OrderList",
    "Trolley",
    "CartBox",
    "Bag",
    "Checkout",
    "Purchase",
    "ItemStore",
    "Collector",
]
# The scenarios compare variants the body names: no request of theirs may become a plain
# baseline sample of auto-disable (at most one a week).
SCENARIO_SPEC = """[spec]
baseline_spacing = 604800
"""
POLICY = """client = "family-{name}"
allow_lane_override = true
[match]
client_header = ["family-{name}"]
"""


def request(max_tokens: int, **fields: Any) -> dict[str, Any]:
    """A greedy streamed request with its usage; ``fields``: the messages or the prompt, and
    whatever else the request carries."""
    greedy = {"max_tokens": max_tokens, "temperature": 0, "stream": True}
    usage = {"stream_options": {"include_usage": True}}
    return {"model": "SmolLM2-135M-Instruct", **greedy, **usage, **fields}


async def events(resp: aiohttp.ClientResponse) -> AsyncIterator[dict[str, Any]]:
    """The JSON events of a streamed answer, as they arrive."""
    async for raw in resp.content:
        line = raw.strip()
        if line.startswith(b"data: {"):
            yield json.loads(line[6:])


async def one(
    session: aiohttp.ClientSession,
    url: str,
    family: str,
    prompt: str,
    max_tokens: int,
    lane: str | None,
    variant: str | None,
) -> dict[str, Any]:
    headers = {"X-Speclane-Client": f"family-{family}"}
    if lane:
        headers["X-Speclane-Lane"] = lane
    if family in EDIT_FAMILIES:
        endpoint, fields = "completions", edit_body(family)
    else:
        endpoint, fields = "chat/completions", {}
        if family in plan.CONSTRAINED:  # a question never asked before in this run
            prompt, fields = plan.constrained_request(family, next(ASKED[family]))
        fields = {"messages": [{"role": "user", "content": prompt}], **fields}
    body = request(max_tokens, **fields)
    if variant is not None:
        body = plan.apply_variant(body, variant)
    first = last = None
    usage: dict[str, Any] = {}
    sent = time.perf_counter()
    async with session.post(f"{url}/{endpoint}", json=body, headers=headers) as resp:
        chosen = resp.headers.get("X-Speclane-Lane")
        decision = resp.headers.get("X-Speclane-Decision")
        async for event in events(resp):
            choice = (event.get("choices") or [{}])[0]
            delta = choice.get("delta") or {}
            if choice.get("text") or delta.get("content") or delta.get("tool_calls"):
                last = time.perf_counter()
                first = first or last
            if event.get("usage"):
                usage = event["usage"]
    tokens = usage.get("completion_tokens", 0)
    # Tokens per second from sending the request to the last token: a draft accepted whole
    # arrives as one burst, so timing from the first text chunk would leave out the tokens
    # that came with it. The prompt is cached after the warm-up, so its prefill weighs
    # little and alike on every variant. The classic decode rate is kept beside it.
    tps = tokens / (last - sent) if last and tokens else None
    decode = None
    if first and last and last > first and tokens > 1:
        decode = (tokens - 1) / (last - first)
    cached = (usage.get("prompt_tokens_details") or {}).get("cached_tokens")
    return {
        "lane": chosen,
        "decision": decision,
        "tokens": tokens,
        "tps": tps,
        "decode_tps": decode,
        "ttft": first - sent if first else None,
        "spec": usage.get("speclane_spec"),
        "cached": cached,
    }


@contextlib.asynccontextmanager
async def router(url: str | None) -> AsyncIterator[str]:
    if url:
        yield url
        return
    with tempfile.TemporaryDirectory(prefix="speclane-families-") as tmp:
        (Path(tmp) / "policies").mkdir()
        for name in FAMILIES:
            (Path(tmp) / "policies" / f"family-{name}.toml").write_text(POLICY.format(name=name))
        (Path(tmp) / "policies" / f"family-{SCENARIO_CLIENT}.toml").write_text(
            POLICY.format(name=SCENARIO_CLIENT) + SCENARIO_SPEC
        )
        config = Path(tmp) / "speclane.toml"
        config.write_text(CONFIG.format(tmp=tmp))
        proc, m = await procs.spawn_until_line(
            [sys.executable, "-m", "router", "serve", "--config", str(config), "--port", "0"],
            r"listening on (http://\S+)",
            deadline=600,
        )
        try:
            yield m.group(1)
        finally:
            await procs.stop(proc)


async def both(
    session: aiohttp.ClientSession,
    url: str,
    family: str,
    prompt: str,
    tokens: int,
    lane: str | None,
    variant: str | None,
) -> dict[str, Any]:
    """Two identical requests at once."""
    start = time.perf_counter()
    runs = await asyncio.gather(
        *(one(session, url, family, prompt, tokens, lane, variant) for _ in range(2))
    )
    return report.together(runs, time.perf_counter() - start)


async def spec_state(session: aiohttp.ClientSession, url: str) -> dict[str, Any]:
    async with session.get(url.removesuffix("/v1") + "/admin/spec") as resp:
        return await resp.json()


async def settle(
    session: aiohttp.ClientSession, url: str, family: str, prompt: str, tokens: int, most: int
) -> int:
    """Routed requests until auto-disable has decided for the source the router drafts this
    family with, down its cascade (or ``most`` requests); how many were sent."""
    for sent in range(1, most + 1):
        run = await one(session, url, family, prompt, tokens, None, None)
        source = (run["spec"] or {}).get("source")
        rows = report.family_rows(await spec_state(session, url), family)
        if report.settled(rows, source, run["lane"]):
            return sent
    return most


async def scenario_one(
    session: aiohttp.ClientSession,
    url: str,
    prompt: str,
    extra: dict[str, Any],
    max_tokens: int,
    variant: str,
) -> dict[str, Any]:
    """One streamed chat request of a scenario on the speculative lane."""
    headers = {"X-Speclane-Client": f"family-{SCENARIO_CLIENT}", "X-Speclane-Lane": "speculative"}
    messages = [{"role": "user", "content": prompt}]
    body = plan.apply_variant(request(max_tokens, messages=messages, **extra), variant)
    last = None
    usage: dict[str, Any] = {}
    sent = time.perf_counter()
    async with session.post(f"{url}/chat/completions", json=body, headers=headers) as resp:
        async for event in events(resp):
            delta = (event.get("choices") or [{}])[0].get("delta") or {}
            if delta.get("content") or delta.get("tool_calls"):
                last = time.perf_counter()
            if event.get("usage"):
                usage = event["usage"]
    tokens = usage.get("completion_tokens", 0)
    return {
        "lane": "speculative",
        "tokens": tokens,
        "tps": tokens / (last - sent) if last and tokens else None,
        "spec": usage.get("speclane_spec"),
    }


async def scenarios(
    session: aiohttp.ClientSession, url: str, names: list[str], rounds: int, max_tokens: int
) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for name in names:
        variants = plan.SCENARIO_VARIANTS[name]
        runs: dict[str, list[dict[str, Any]]] = {v: [] for v in variants}
        constrained = name in plan.CONSTRAINED
        if constrained:
            prompt, extra = plan.constrained_request(name)
            await scenario_one(session, url, prompt, extra, 4, plan.PLAIN)  # warm-up
        else:  # the first answer, which the suffix index keeps
            prompt, extra = REPEAT_PROMPT.format(name=NAMES[0]), {}
            await scenario_one(session, url, prompt, extra, max_tokens, plan.PLAIN)
        for i in range(rounds):
            if name == "near-repeat":  # a name never sent before: only others' answers
                prompt = REPEAT_PROMPT.format(name=NAMES[1 + i % (len(NAMES) - 1)])
            if constrained and i:  # a fresh subject, its prompt cached alike for both
                prompt, extra = plan.constrained_request(name, i)
                await scenario_one(session, url, prompt, extra, 1, plan.PLAIN)
            for v in variants:
                runs[v].append(await scenario_one(session, url, prompt, extra, max_tokens, v))
        out[name] = {v: report.summarise(r) for v, r in runs.items()}
        print(f"  {name}: done", flush=True)
    return out


async def batch_one(
    session: aiohttp.ClientSession,
    url: str,
    family: str,
    max_tokens: int,
    variant: str,
    subject: int = 0,
) -> dict[str, Any]:
    """One streamed request on the batching lane, as the scenario client (no plain baseline
    samples: each variant is what its body names): an edit family's body, or a constrained
    family's question about its ``subject``-th subject."""
    headers = {"X-Speclane-Client": f"family-{SCENARIO_CLIENT}", "X-Speclane-Lane": "batching"}
    if family in plan.CONSTRAINED:
        prompt, extra = plan.constrained_request(family, subject)
        endpoint = "chat/completions"
        fields = {"messages": [{"role": "user", "content": prompt}], **extra}
    else:
        endpoint, fields = "completions", edit_body(family)
    body = plan.apply_variant(request(max_tokens, **fields), variant)
    usage: dict[str, Any] = {}
    first = last = None
    async with session.post(f"{url}/{endpoint}", json=body, headers=headers) as resp:
        lane = resp.headers.get("X-Speclane-Lane")
        async for event in events(resp):
            choice = (event.get("choices") or [{}])[0]
            delta = choice.get("delta") or {}
            if choice.get("text") or delta.get("content") or delta.get("tool_calls"):
                last = time.perf_counter()
                first = first or last
            usage = event.get("usage") or usage
    tokens = usage.get("completion_tokens", 0)
    decode = None
    if first and last and last > first and tokens > 1:
        decode = round((tokens - 1) / (last - first), 2)
    return {
        "lane": lane,
        "tokens": tokens,
        "decode_tps": decode,
        "spec": usage.get("speclane_spec"),
    }


async def batch_scenarios(
    session: aiohttp.ClientSession,
    url: str,
    names: list[str],
    rounds: int,
    max_tokens: dict[str, int],
) -> dict[str, Any]:
    """Each family of the ``names`` batch scenarios, BATCH_CONCURRENCY requests at once on
    the batching lane: drafting against plain, interleaved round by round. ``max_tokens``:
    per kind (``edit``, ``constrained``)."""
    out: dict[str, Any] = {}
    for family, source in (pair for name in names for pair in BATCH_SCENARIOS[name]):
        constrained = family in plan.CONSTRAINED
        tokens_each = max_tokens["constrained" if constrained else "edit"]
        if not constrained:
            await batch_one(session, url, family, 4, plan.PLAIN)  # warm-up: the prompt cached
        # Constrained: the forced variant first, so no earlier answer to the same questions
        # is in the suffix index when it runs.
        variants = (source, plan.PLAIN) if constrained else (plan.PLAIN, source)
        runs: dict[str, list[dict[str, Any]]] = {v: [] for v in variants}
        for round_ in range(rounds):
            subjects = [round_ * BATCH_CONCURRENCY + j for j in range(BATCH_CONCURRENCY)]
            if not constrained:
                subjects = [0] * BATCH_CONCURRENCY
            else:  # fresh questions: each prompt cached alike for both variants
                for subject in subjects:
                    await batch_one(session, url, family, 1, plan.PLAIN, subject)
            for variant in variants:
                start = time.perf_counter()
                answers = await asyncio.gather(
                    *(batch_one(session, url, family, tokens_each, variant, s) for s in subjects)
                )
                seconds = time.perf_counter() - start
                tokens = sum(a["tokens"] for a in answers)
                specs = [a["spec"] or {} for a in answers]
                runs[variant].append(
                    {
                        "tokens": tokens,
                        "seconds": round(seconds, 3),
                        "aggregate_tps": round(tokens / seconds, 2),
                        "decode_tps": [a["decode_tps"] for a in answers],
                        "drafted": sum(s.get("drafted", 0) for s in specs),
                        "accepted": sum(s.get("accepted", 0) for s in specs),
                        "forced": sum(s.get("forced", 0) for s in specs),
                        "sources": sorted({str(s.get("source")) for s in specs}),
                        "lanes": sorted({str(a["lane"]) for a in answers}),
                    }
                )
        summary = {
            v: {
                "aggregate_tps": round(
                    sum(r["tokens"] for r in rs) / sum(r["seconds"] for r in rs), 2
                ),
                "decode_tps_median": _median(
                    [d for r in rs for d in r["decode_tps"] if d is not None]
                ),
                "runs": rs,
            }
            for v, rs in runs.items()
        }
        plain_tps = summary[plan.PLAIN]["aggregate_tps"]
        out[family] = {
            "source": source,
            "concurrency": BATCH_CONCURRENCY,
            "max_tokens": tokens_each,
            "ratio": round(summary[source]["aggregate_tps"] / plain_tps, 2) if plain_tps else None,
            **summary,
        }
        print(f"  batching lane, {family}: {out[family]['ratio']}x", flush=True)
    return out


def _median(values: list[float]) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    mid = len(ordered) // 2
    middle = ordered[mid] if len(ordered) % 2 else (ordered[mid - 1] + ordered[mid]) / 2
    return round(middle, 2)


def batch_table(results: dict[str, Any]) -> str:
    rows = []
    for family, r in results.items():
        drafting, plain = r[r["source"]], r["plain"]
        accepted = sum(x["accepted"] for x in drafting["runs"])
        drafted = sum(x["drafted"] for x in drafting["runs"])
        forced = sum(x.get("forced", 0) for x in drafting["runs"])
        figures = [drafting["aggregate_tps"], f"{r['ratio']}x"]
        decode = [plain.get("decode_tps_median"), drafting.get("decode_tps_median")]
        rows.append(
            [
                f"{family} ({r['source']})",
                plain["aggregate_tps"],
                *figures,
                *decode,
                f"{accepted}/{drafted}",
                forced,
            ]
        )
    header = [
        "family (source)",
        "plain tok/s",
        "drafting tok/s",
        "ratio",
        "plain decode tok/s (median request)",
        "drafting decode tok/s (median request)",
        "accepted/drafted",
        "forced",
    ]
    return "\n".join(stats.table(header, rows, "lrrrrrrr"))


async def run(args: argparse.Namespace) -> dict[str, Any]:
    results: dict[str, Any] = {}
    timeout = aiohttp.ClientTimeout(total=900)
    async with router(args.url) as url, aiohttp.ClientSession(timeout=timeout) as session:
        batch = [s for s in args.scenarios if s in BATCH_SCENARIOS]
        if batch:
            most = {"edit": args.edit_max_tokens, "constrained": args.scenario_max_tokens}
            results["batch_scenarios"] = await batch_scenarios(
                session, url, batch, args.requests, most
            )
        named = [s for s in args.scenarios if s not in BATCH_SCENARIOS]
        if named:
            results["scenarios"] = await scenarios(
                session, url, named, args.requests, args.scenario_max_tokens
            )
        for family in args.families:
            prompt = FAMILIES[family]
            tokens = args.edit_max_tokens if family in EDIT_FAMILIES else args.max_tokens
            # --routed-only: plain decoding (also auto-disable's baseline) and the routed run
            names = (plan.PLAIN,) if args.routed_only else plan.variants(family)
            for lane in ("speculative", "batching"):  # warm-up: each lane caches the prompt
                await one(session, url, family, prompt, 4, lane, plan.PLAIN)
            c1: dict[str, list[dict[str, Any]]] = {v: [] for v in names}
            for _ in range(args.requests):  # interleaved, so drift hits every variant alike
                for v in names:
                    c1[v].append(await one(session, url, family, prompt, tokens, "speculative", v))
            c2, c2_batching = {}, None
            if not args.routed_only:
                c2 = {
                    v: await both(session, url, family, prompt, tokens, "speculative", v)
                    for v in names
                }
                c2_batching = await both(
                    session, url, family, prompt, tokens, "batching", plan.PLAIN
                )
            settled = await settle(session, url, family, prompt, tokens, args.settle_max)
            routed, plain_after = [], []
            for _ in range(args.requests):  # interleaved with plain decoding again, so that
                # the routed/plain ratio compares requests of the same minutes
                plain_after.append(
                    await one(session, url, family, prompt, tokens, "speculative", plan.PLAIN)
                )
                routed.append(await one(session, url, family, prompt, tokens, None, None))
            routed_c2 = (
                None
                if args.routed_only
                else await both(session, url, family, prompt, tokens, None, None)
            )
            rows = report.family_rows(await spec_state(session, url), family)
            results[family] = {
                "c1": {v: report.summarise(runs) for v, runs in c1.items()},
                "c2": c2,
                "c2_batching": c2_batching,
                "settle_requests": settled,
                "routed": report.summarise(routed),
                "routed_c2": routed_c2,
                "plain_beside_routed": report.summarise(plain_after),
                "routed_decisions": [r["decision"] for r in routed],
                "auto_disable": [
                    {
                        "workload": row["workload"],
                        "source": row.get("source"),
                        "state": row["state"],
                        "reason": row["reason"],
                        "window_acceptance": row["window"]["acceptance"],
                        "spec_tps": row["speed"]["spec_tps"],
                        "baseline_tps": row["speed"]["baseline_tps"],
                    }
                    for row in rows
                ],
            }
            print(f"  {family}: done (settled after {settled} routed requests)", flush=True)
    return results


def _commit() -> str | None:
    import subprocess

    with contextlib.suppress(OSError, subprocess.SubprocessError):
        out = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"],
            capture_output=True,
            text=True,
            cwd=Path(__file__).parent,
            timeout=10,
        )
        return out.stdout.strip() or None
    return None


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--url", help="an already running speclane (with the family policies)")
    p.add_argument("--requests", type=int, default=3, help="per variant and family")
    p.add_argument("--max-tokens", type=int, default=48)
    p.add_argument("--edit-max-tokens", type=int, default=160)
    p.add_argument(
        "--settle-max",
        type=int,
        default=12,
        help="routed requests at most while waiting for auto-disable to decide",
    )
    p.add_argument(
        "--families",
        type=lambda v: [f for f in v.split(",") if f],
        default=list(FAMILIES),
        help="comma-separated, of: " + ", ".join(FAMILIES),
    )
    p.add_argument(
        "--scenarios",
        type=lambda v: [s for s in v.split(",") if s],
        default=[],
        help="comma-separated, of: " + ", ".join([*plan.SCENARIO_VARIANTS, *BATCH_SCENARIOS]),
    )
    p.add_argument("--scenario-max-tokens", type=int, default=96)
    p.add_argument(
        "--routed-only",
        action="store_true",
        help="per family only plain decoding and the routed run once auto-disable has decided",
    )
    p.add_argument("--out", type=Path, default=Path("bench-results/spec-families.json"))
    args = p.parse_args()
    unknown = set(args.families) - set(FAMILIES)
    if unknown:
        p.error(f"unknown families: {', '.join(sorted(unknown))}")
    if set(args.scenarios) - set(plan.SCENARIO_VARIANTS) - set(BATCH_SCENARIOS):
        p.error(f"unknown scenarios: {', '.join(args.scenarios)}")
    load_before = list(os.getloadavg())
    results = asyncio.run(run(args))
    scenario_results = results.pop("scenarios", {})
    batch_results = results.pop("batch_scenarios", {})
    meta: dict[str, Any] = {
        "requests": args.requests,
        "max_tokens": args.max_tokens,
        "edit_max_tokens": args.edit_max_tokens,
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "commit": _commit(),
        "load_average_before": load_before,
        "load_average": list(os.getloadavg()),
        "routed_only": args.routed_only,
    }
    if results:
        print(report.table(results))
        print(json.dumps(report.goals(results), indent=1))
        meta.update(table=report.table(results).split("\n"), goals=report.goals(results))
    if scenario_results:
        print(report.scenario_table(scenario_results))
        print(json.dumps(report.scenario_goals(scenario_results), indent=1))
        meta.update(
            scenario_max_tokens=args.scenario_max_tokens,
            scenario_table=report.scenario_table(scenario_results).split("\n"),
            scenario_goals=report.scenario_goals(scenario_results),
        )
    out: dict[str, Any] = {"meta": meta, "families": results, "scenarios": scenario_results}
    if batch_results:
        print(batch_table(batch_results))
        meta.update(batch_table=batch_table(batch_results).split("\n"))
        out["batch_scenarios"] = batch_results
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(out, indent=2))
    print(f"saved {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
