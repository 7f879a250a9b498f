"""``speclane bench prefill``: each target through the steps, restarted (or its model unloaded
and loaded) where a step says."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import tempfile
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp

from router.bench.common import environment, procs
from router.bench.prefill import convert, plan, shapes
from router.bench.prefill.plan import MLX_LM_MODEL, SPECLANE
from router.bench.prefill.send import Outcome, send

TIMEOUT = aiohttp.ClientTimeout(total=1800.0)  # a cold 2k-token prefill on a busy CPU
UNLOAD_SECONDS = 120.0


@contextlib.asynccontextmanager
async def serving(
    target: str, model_dir: Path, cache_dir: Path, log_path: Path
) -> AsyncIterator[str]:
    """The target's base URL (``.../v1``); speclane with its disk tier in ``cache_dir`` (kept
    across a restart, as the user's is) and its model unpinned (so that it can be unloaded)."""
    if target == SPECLANE:
        lanes = procs.LaneOptions(
            model=str(model_dir), prompt_cache_dir=str(cache_dir), unpinned=True
        )
        async with procs.own_router(lanes, log_path) as url:
            yield url
    else:
        async with procs.mlx_lm_server(model_dir, log_path) as served:
            yield served.url


async def unload_and_load(session: aiohttp.ClientSession, base_url: str, model: str) -> float:
    """Unload ``model`` through the Ollama door (``keep_alive: 0``), wait until ``/api/ps`` no
    longer lists it, then load it again (a generate request without a prompt); the seconds
    the load took."""
    root = base_url.removesuffix("/v1")
    async with session.post(f"{root}/api/generate", json={"model": model, "keep_alive": 0}) as r:
        r.raise_for_status()
    deadline = time.monotonic() + UNLOAD_SECONDS
    while True:
        async with session.get(f"{root}/api/ps") as r:
            loaded = [m.get("name") for m in (await r.json()).get("models", [])]
        if model not in loaded:
            break
        if time.monotonic() > deadline:
            raise RuntimeError(f"{model} was not unloaded in {UNLOAD_SECONDS:g} s")
        await asyncio.sleep(0.5)
    began = time.perf_counter()
    async with session.post(f"{root}/api/generate", json={"model": model}) as r:
        r.raise_for_status()
    return time.perf_counter() - began


async def run_target(
    target: str, model_dir: Path, args: argparse.Namespace, steps: list[plan.Step]
) -> list[dict[str, Any]]:
    """The steps against ``target``: started afresh before each stage (speclane: unloaded and
    loaded where a stage says so, on the same server)."""
    tokenizer = _tokenizer(model_dir) if target != SPECLANE else None
    records: list[dict[str, Any]] = []
    prompts: dict[str, int] = {}  # step -> its prompt's tokens
    with tempfile.TemporaryDirectory(prefix="speclane-prefill-") as tmp:
        cache_dir = Path(tmp) / "prompt-cache"
        stages = plan.stages(steps)
        n = 0
        while n < len(stages):
            log_path = args.out.with_suffix(f".{target.replace('.', '_')}.{n}.log")
            async with (
                serving(target, model_dir, cache_dir, log_path) as url,
                aiohttp.ClientSession(timeout=TIMEOUT) as session,
            ):
                while True:
                    before, stage = stages[n]
                    reload_s = None
                    if before == "unload" and target == SPECLANE:
                        try:
                            reload_s = await unload_and_load(session, url, model_dir.name)
                        except (RuntimeError, aiohttp.ClientError) as e:
                            failed = f"unload and load: {type(e).__name__}: {e}"
                            records += [{"step": s.name, "error": failed} for s in stage]
                            stage = []
                    for step in stage:
                        body = shapes.with_max_tokens(step.body, args.max_tokens)
                        if target == SPECLANE:
                            door, body = step.door, {**body, "model": model_dir.name}
                        else:
                            door = "chat"
                            body = convert.for_mlx_lm(step.door, body, tokenizer, MLX_LM_MODEL)
                        outcome = await send(session, url, door, body)
                        records.append(record(step, outcome, prompts, reload_s))
                        reload_s = None
                        print(f"  {target} {step.name}: {records[-1]}", flush=True)
                        if outcome.prompt_tokens is not None:
                            prompts[step.name] = outcome.prompt_tokens
                    n += 1
                    # speclane unloads its model on the same server; mlx_lm.server restarts
                    if n == len(stages) or stages[n][0] != "unload" or target != SPECLANE:
                        break
    return records


def _tokenizer(model_dir: Path) -> Any:
    from mlx_lm.utils import load_tokenizer

    return load_tokenizer(model_dir)


def record(
    step: plan.Step, outcome: Outcome, prompts: dict[str, int], reload_s: float | None
) -> dict[str, Any]:
    prompt, cached = outcome.prompt_tokens, outcome.cached_tokens
    out: dict[str, Any] = {
        "step": step.name,
        "door": step.door,
        "before": step.before or None,
        "prompt_tokens": prompt,
        "cached_tokens": cached,
        "prefilled_tokens": prompt - cached if prompt is not None and cached is not None else None,
        "ttft_s": outcome.ttft,
        "error": outcome.error,
    }
    if reload_s is not None:
        out["reload_s"] = reload_s
    if prompt is not None and step.follows is not None:
        out["ideal_new_tokens"] = plan.ideal(prompt, prompts.get(step.follows))
    if step.goal is not None:
        out["goal"] = {**dataclasses.asdict(step.goal), "text": step.goal.text()}
    return out


async def run(args: argparse.Namespace) -> dict[str, Any]:
    from router.lanes.modelprep import ensure_default_models

    model_dir = Path(args.model) if args.model else ensure_default_models(quiet=True)[0]
    args.out.parent.mkdir(parents=True, exist_ok=True)
    steps = plan.steps(args.fixtures)
    load_before = environment.load_average()
    targets: dict[str, Any] = {}
    for target in args.targets:
        print(f"{target}:", flush=True)
        try:
            targets[target] = await run_target(target, model_dir, args, steps)
        except (RuntimeError, OSError, TimeoutError, aiohttp.ClientError) as e:
            targets[target] = [{"error": f"{type(e).__name__}: {e}"}]
    return {
        "bench": "prefill",
        "date": environment.now_iso(),
        "commit": environment.commit(),
        "model": str(model_dir),
        "max_tokens": args.max_tokens,
        "trim": {
            "system_chars": shapes.SYSTEM_CHARS,
            "text_chars": shapes.TEXT_CHARS,
            "tools": sorted(shapes.TOOLS),
        },
        "environment": {
            "versions": environment.versions(),
            "hardware": environment.hardware(),
            "load_average_before": load_before,
            "load_average_after": environment.load_average(),
        },
        "targets": targets,
    }
