"""``speclane bench session``: each session of ``router.bench.session.script`` with every
target, turn by turn, the targets alternating at every turn so that a shared machine's load
weighs on all alike; with ``--agents N``, N copies of each session at once (each its own
file), one target after another, timed by their makespan. Targets: ``mlx_lm.server``
(plain greedy decoding: the reference outputs), ``mlx_lm.server --draft-model``, speclane
with its default configuration (the lane chooses the draft at every step) and speclane with
one source fixed by the request's ``draft_source`` (each fixed source as its own client: its
own prompt cache, suffix index and evidence, auto-disable off)."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp

from router.bench.common import environment, procs
from router.bench.common.stream import Reply, chat
from router.bench.session.report import fmt_turn, summarise, summarise_agents
from router.bench.session.script import SESSIONS, Session, for_agent
from router.config.names import DECISION_HEADER, LANE_HEADER, LANE_NAMES

PLAIN = "mlx_lm.server"
DRAFTED = "mlx_lm.server+draft"
AUTO = "speclane"
FIXED_SOURCES = ("prompt_lookup", "suffix", "draft_model")
TARGETS = (PLAIN, DRAFTED, AUTO, *(f"speclane:{s}" for s in FIXED_SOURCES))
# Not run by default: every request held on one lane by the lane header (what the router's
# own placement is compared with, e.g. several agents all in the batching lane's batch).
CHOICES = (*TARGETS, *(f"speclane@{lane}" for lane in LANE_NAMES))


# The warm-up's answer length: above the router's short-output rule (16 tokens), so that it
# reaches the speculative lane the turns use, not the batching lane.
WARM_TOKENS = 24


def fixed_client(source: str) -> str:
    return f"bench-session-{source.replace('_', '-')}"


def fixed_key(source: str) -> str:
    return f"sk-{fixed_client(source)}"


def lane_client(lane: str) -> str:
    return f"bench-session-lane-{lane}"


def lane_key(lane: str) -> str:
    return f"sk-{lane_client(lane)}"


def session_policies() -> dict[str, str]:
    """The bench's policies plus one client per fixed source (auto-disable off: the source
    stays as named) and one per lane held by the header (the default's settings), each known
    by its key: a key is what gives a client a prompt cache, suffix index and evidence of its
    own (a label alone shares the default partition, so a target run after ``speclane``
    would copy its identical answers from the suffix index)."""
    out = dict(procs.POLICIES)
    for source in FIXED_SOURCES:
        client = fixed_client(source)
        out[f"{client}.toml"] = (
            f'client = "{client}"\n[match]\napi_keys = ["{fixed_key(source)}"]\n'
            "[spec]\nenabled = false\n"
        )
    for lane in LANE_NAMES:
        client = lane_client(lane)
        out[f"{client}.toml"] = (
            f'client = "{client}"\nallow_lane_override = true\n'
            f'[match]\napi_keys = ["{lane_key(lane)}"]\n'
        )
    return out


@dataclass
class Target:
    name: str
    base_url: str
    model: str
    headers: dict[str, str] = field(default_factory=dict)
    body: dict[str, Any] = field(default_factory=dict)

    async def send(
        self, session: aiohttp.ClientSession, messages: list[dict[str, str]], max_tokens: int
    ) -> tuple[Reply, float]:
        body = {"model": self.model, "messages": messages, "max_tokens": max_tokens}
        started = time.perf_counter()
        reply = await chat(
            session, self.base_url, {**body, "temperature": 0, **self.body}, self.headers
        )
        return reply, time.perf_counter() - started


def router_targets(url: str, model: str) -> list[Target]:
    """speclane's targets on one router: its own choice, each source fixed, each lane held;
    each but the first a client of its own (``session_policies``)."""
    return [
        Target(AUTO, url, model),
        *(
            Target(
                f"speclane:{s}",
                url,
                model,
                {"Authorization": f"Bearer {fixed_key(s)}"},
                {"draft_source": s},
            )
            for s in FIXED_SOURCES
        ),
        *(
            Target(
                f"speclane@{lane}",
                url,
                model,
                {"Authorization": f"Bearer {lane_key(lane)}", LANE_HEADER: lane},
            )
            for lane in LANE_NAMES
        ),
    ]


def turn_row(turn: int, kind: str, reply: Reply, seconds: float) -> dict[str, Any]:
    spec = reply.usage.get("speclane_spec")
    spec = spec if isinstance(spec, dict) else {}
    return {
        "turn": turn,
        "kind": kind,
        "seconds": seconds,
        "ttft_s": reply.ttft,
        "completion_tokens": reply.completion_tokens,
        "prompt_tokens": reply.usage.get("prompt_tokens"),
        "cached_tokens": reply.cached_tokens,
        "lane": reply.headers.get(LANE_HEADER),
        "decision": reply.headers.get(DECISION_HEADER),
        "drafted": spec.get("drafted"),
        "accepted": spec.get("accepted"),
        "sources": spec.get("sources"),
        "plain_steps": spec.get("plain_steps"),
        "text": reply.text,
        "error": reply.error,
    }


async def run_session(
    http: aiohttp.ClientSession, script: Session, targets: list[Target], max_tokens: int
) -> dict[str, list[dict[str, Any]]]:
    """One session with every target, alternating at every turn."""
    system = {"role": "system", "content": script.system}
    history = {t.name: [system] for t in targets}
    rows: dict[str, list[dict[str, Any]]] = {t.name: [] for t in targets}
    for number, turn in enumerate(script.turns, 1):
        for t in targets:
            messages = history[t.name]
            messages.append({"role": "user", "content": turn.ask})
            reply, seconds = await t.send(http, messages, max_tokens)
            row = turn_row(number, turn.kind, reply, seconds)
            rows[t.name].append(row)
            print(
                f"  {script.name} turn {number} ({turn.kind}) {t.name}: {fmt_turn(row)}", flush=True
            )
            messages.append({"role": "assistant", "content": reply.text})
    return rows


async def run_agent(
    http: aiohttp.ClientSession, script: Session, target: Target, max_tokens: int
) -> list[dict[str, Any]]:
    """One agent's session on one target, turn after turn (its own history)."""
    messages = [{"role": "system", "content": script.system}]
    rows = []
    for number, turn in enumerate(script.turns, 1):
        messages.append({"role": "user", "content": turn.ask})
        reply, seconds = await target.send(http, messages, max_tokens)
        row = turn_row(number, turn.kind, reply, seconds)
        rows.append(row)
        print(f"  {script.name} turn {number} ({turn.kind}) {target.name}: {fmt_turn(row)}")
        messages.append({"role": "assistant", "content": reply.text})
    return rows


async def run_agents(
    http: aiohttp.ClientSession, script: Session, targets: list[Target], args: argparse.Namespace
) -> dict[str, dict[str, Any]]:
    """``args.agents`` copies of a session at once (each its own file), on each target in
    turn; the targets' order alternates between sessions so that load drift weighs alike."""
    out: dict[str, dict[str, Any]] = {}
    for target in targets:
        started = time.perf_counter()
        agents = await asyncio.gather(
            *(run_agent(http, for_agent(script, k), target, args.max_tokens)
              for k in range(args.agents))
        )  # fmt: skip
        out[target.name] = {"makespan_s": time.perf_counter() - started, "agents": agents}
        print(
            f"  {script.name} x{args.agents} {target.name}: {out[target.name]['makespan_s']:.1f} s"
        )
    return out


async def measure(targets: list[Target], args: argparse.Namespace) -> dict[str, Any]:
    timeout = aiohttp.ClientTimeout(total=3600)
    async with aiohttp.ClientSession(timeout=timeout) as http:
        for t in targets:  # first-call costs are no turn's
            await t.send(http, [{"role": "user", "content": "Hi"}], WARM_TOKENS)
        if args.agents > 1:
            return {
                name: await run_agents(
                    http, SESSIONS[name], targets[:: 1 if i % 2 == 0 else -1], args
                )
                for i, name in enumerate(args.sessions)
            }
        return {
            name: await run_session(http, SESSIONS[name], targets, args.max_tokens)
            for name in args.sessions
        }


async def run(args: argparse.Namespace) -> dict[str, Any]:
    from router.lanes.modelprep import ensure_default_models

    model_dir, draft_dir = ensure_default_models(quiet=True)
    if args.model:
        model_dir = Path(args.model)
    if args.draft_model:
        draft_dir = Path(args.draft_model)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    wanted = set(args.targets)
    print(
        f"sessions {', '.join(args.sessions)} on {model_dir}; targets {', '.join(args.targets)}",
        flush=True,
    )
    lanes = procs.LaneOptions(model=str(model_dir), draft_model=str(draft_dir))
    draft_flags = [
        "--draft-model",
        str(draft_dir),
        "--num-draft-tokens",
        str(args.num_draft_tokens),
    ]
    async with contextlib.AsyncExitStack() as stack:
        every: list[Target] = []
        if PLAIN in wanted:
            plain = await stack.enter_async_context(
                procs.mlx_lm_server(model_dir, args.out.with_suffix(".mlx_lm.log"))
            )
            every.append(Target(PLAIN, plain.url, "default_model"))  # its --model
        if DRAFTED in wanted:
            log = args.out.with_suffix(".mlx_lm_draft.log")
            drafted = await stack.enter_async_context(
                procs.mlx_lm_server(model_dir, log, draft_flags)
            )
            every.append(Target(DRAFTED, drafted.url, "default_model"))
        if wanted & {AUTO, *(name for name in CHOICES if name.startswith("speclane"))}:
            log = args.out.with_suffix(".router.log")
            url = await stack.enter_async_context(procs.own_router(lanes, log, session_policies()))
            async with aiohttp.ClientSession() as http:
                model = (await environment.served_models(http, url) or [model_dir.name])[0]
            every += router_targets(url, model)
        # In --targets order: the first is the reference where mlx_lm.server is not run.
        order = {name: i for i, name in enumerate(args.targets)}
        chosen = sorted((t for t in every if t.name in wanted), key=lambda t: order[t.name])
        results = await measure(chosen, args)
    return {
        "bench": "session",
        "date": environment.now_iso(),
        "model": str(model_dir),
        "draft_model": str(draft_dir),
        "settings": {k: v for k, v in vars(args).items() if k != "out"},
        "environment": environment.record(),
        "results": results,
        "summary": summarise_agents(results) if args.agents > 1 else summarise(results),
    }
