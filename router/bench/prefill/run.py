"""``speclane bench prefill``: each target through the steps, restarted where a step says."""

from __future__ import annotations

import argparse
import contextlib
import tempfile
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp

from router.bench.common import environment, procs
from router.bench.common.stream import Reply, chat
from router.bench.prefill import plan
from router.bench.prefill.plan import MLX_LM_MODEL, SPECLANE

TIMEOUT = aiohttp.ClientTimeout(total=1800.0)  # a cold 2k-token prefill on a busy CPU


@contextlib.asynccontextmanager
async def serving(
    target: str, model_dir: Path, cache_dir: Path, log_path: Path
) -> AsyncIterator[tuple[str, str]]:
    """The target's base URL and model name; speclane with its disk tier in ``cache_dir``
    (kept across a restart, as the user's is)."""
    if target == SPECLANE:
        lanes = procs.LaneOptions(model=str(model_dir), prompt_cache_dir=str(cache_dir))
        async with procs.own_router(lanes, log_path) as url:
            yield url, model_dir.name
    else:
        async with procs.mlx_lm_server(model_dir, log_path) as served:
            yield served.url, MLX_LM_MODEL


async def run_target(
    target: str, model_dir: Path, args: argparse.Namespace, system: str, file_text: str
) -> list[dict[str, Any]]:
    """The steps against ``target``, started afresh before each stage."""
    records: list[dict[str, Any]] = []
    history: dict[str, list[tuple[str, str]]] = {}
    last: dict[str, tuple[int, int]] = {}  # conversation -> (prompt, completion) of its last turn
    with tempfile.TemporaryDirectory(prefix="speclane-prefill-") as tmp:
        cache_dir = Path(tmp) / "prompt-cache"
        for n, stage in enumerate(plan.stages(plan.steps(file_text))):
            log_path = args.out.with_suffix(f".{target.replace('.', '_')}.{n}.log")
            async with (
                serving(target, model_dir, cache_dir, log_path) as (url, model),
                aiohttp.ClientSession(timeout=TIMEOUT) as session,
            ):
                for step in stage:
                    turns = history.setdefault(step.conversation, [])
                    body = plan.body(
                        model, plan.messages(system, turns, step.user), args.max_tokens
                    )
                    reply = await chat(session, url, body, {}, Reply())
                    records.append(record(step, reply, last.get(step.conversation)))
                    print(f"  {target} {step.name}: {records[-1]}", flush=True)
                    if isinstance(prompt := reply.usage.get("prompt_tokens"), int):
                        last[step.conversation] = (prompt, reply.completion_tokens)
                    turns.append((step.user, reply.text))
    return records


def record(step: plan.Step, reply: Reply, previous: tuple[int, int] | None) -> dict[str, Any]:
    prompt = reply.usage.get("prompt_tokens")
    cached = reply.cached_tokens
    out: dict[str, Any] = {
        "step": step.name,
        "conversation": step.conversation,
        "restarted_before": step.restart_before,
        "prompt_tokens": prompt,
        "cached_tokens": cached,
        "prefilled_tokens": prompt - cached
        if isinstance(prompt, int) and cached is not None
        else None,
        "ttft_s": reply.ttft,
        "error": reply.error,
    }
    if isinstance(prompt, int) and step.continues and previous is not None:
        out["ideal_new_tokens"] = plan.ideal(prompt, *previous)
    return out


async def run(args: argparse.Namespace) -> dict[str, Any]:
    from router.lanes.modelprep import ensure_default_models

    model_dir = Path(args.model) if args.model else ensure_default_models(quiet=True)[0]
    args.out.parent.mkdir(parents=True, exist_ok=True)
    system, file_text = plan.system_prompt(args.rules), plan.source_file(args.functions)
    load_before = environment.load_average()
    targets: dict[str, Any] = {}
    for target in args.targets:
        print(f"{target}:", flush=True)
        try:
            targets[target] = await run_target(target, model_dir, args, system, file_text)
        except (RuntimeError, OSError, TimeoutError) as e:  # a server that did not start
            targets[target] = [{"error": f"{type(e).__name__}: {e}"}]
    return {
        "bench": "prefill",
        "date": environment.now_iso(),
        "commit": environment.commit(),
        "model": str(model_dir),
        "max_tokens": args.max_tokens,
        "rules": args.rules,
        "functions": args.functions,
        "environment": {
            "versions": environment.versions(),
            "hardware": environment.hardware(),
            "load_average_before": load_before,
            "load_average_after": environment.load_average(),
        },
        "targets": targets,
    }
