"""``speclane bench agent``: an agent-shaped conversation against speclane's batching lane and,
in the same run, against ``mlx_lm.server`` started here on the same model directory.

What a coding agent does to a local server: a long system prompt and a few tools resent on
every turn, each turn appending the previous answer and a new user message. Both servers run
for the whole bench (an idle one costs nothing); each measurement talks to one target at a
time, alternating between them, so that the load of a shared machine weighs on both alike:

- per turn: time to the first token (TTFT), decode tokens/s after it, prompt tokens and the
  prompt tokens the server reports as cached (``usage.prompt_tokens_details.cached_tokens``);
- aggregate decode throughput of ``concurrency`` simultaneous short streams (end-of-text
  tokens banned, so every stream runs its full ``max_tokens``);
- starvation: a short stream is decoding when a long new prompt arrives; its largest gap
  between two tokens while that prompt is prefilled (until the long prompt's first token).

The goals, as ratios from one run: turn 2+ TTFT at most 1.0x ``mlx_lm.server``'s, aggregate
throughput at least 1.0x, and the short stream's largest gap under 2 s. The numbers are
printed and written as JSON; nothing here asserts them.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import itertools
import json
import os
import statistics
import sys
import time
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp

from router import sse
from router.bench import environment, launch, procs

LANE_HEADERS = {"X-Speclane-Lane": "batching"}
NO_EOS = {"0": -100, "2": -100}  # SmolLM2's end-of-text tokens (the default model)
GAP_GOAL = 2.0
MLX_START_DEADLINE = 600.0
REQUEST_TIMEOUT = 1800.0

TOOLS = [
    {"type": "function", "function": {
        "name": name, "description": description,
        "parameters": {"type": "object", "properties": {
            arg: {"type": "string", "description": f"the {arg}"} for arg in args},
            "required": list(args)}}}
    for name, description, args in (
        ("read", "Read a file of the workspace.", ("path",)),
        ("edit", "Replace a string in a file.", ("path", "old", "new")),
        ("exec", "Run a shell command in the workspace.", ("command",)),
    )
]
QUESTIONS = (
    "The test suite fails in parser.py with an IndexError. What do you check first?",
    "You found an off-by-one in the loop. Describe the smallest fix.",
    "Now the tests pass. Write a one-line commit message.",
    "Which other files might have the same bug?",
    "Summarise what we did in two sentences.",
)


def system_prompt(approx_tokens: int) -> str:
    """A deterministic agent system prompt of roughly ``approx_tokens`` tokens."""
    rules = [
        "Read a file before you edit it.", "Keep each change small and reviewable.",
        "Run the tests after every edit.", "Never commit secrets or credentials.",
        "Prefer the standard library to a new dependency.", "Explain why, not what.",
        "Ask before deleting files.", "Quote error messages exactly.",
    ]
    lines = ["You are a coding agent working in a git repository. Follow these rules."]
    i = 0
    while sum(len(x) for x in lines) < approx_tokens * 4:
        lines.append(f"Rule {i + 1}: {rules[i % len(rules)]} (section {i // len(rules) + 1})")
        i += 1
    return "\n".join(lines)


def long_document(approx_tokens: int, topic: str) -> str:
    lines, i = [], 0
    while sum(len(x) for x in lines) < approx_tokens * 4:
        lines.append(f"{topic} log line {i}: module {i % 17} compiled, {i * 7 % 101} warnings.")
        i += 1
    return "\n".join(lines)


# --- pure measurements -----------------------------------------------------------------


@dataclass
class Stream:
    """One streamed answer as the client saw it (monotonic seconds)."""

    sent: float
    token_times: list[float] = field(default_factory=list)  # arrival of each content chunk
    text: str = ""
    usage: dict[str, Any] = field(default_factory=dict)
    error: str | None = None

    @property
    def ttft(self) -> float | None:
        return self.token_times[0] - self.sent if self.token_times else None

    @property
    def completion_tokens(self) -> int:
        value = self.usage.get("completion_tokens")
        return value if isinstance(value, int) else len(self.token_times)

    @property
    def cached_tokens(self) -> int | None:
        details = self.usage.get("prompt_tokens_details")
        value = details.get("cached_tokens") if isinstance(details, dict) else None
        return value if isinstance(value, int) else None

    def decode_rate(self) -> float | None:
        """Tokens after the first per second after the first."""
        if len(self.token_times) < 2:
            return None
        span = self.token_times[-1] - self.token_times[0]
        return (self.completion_tokens - 1) / span if span > 0 else None


def largest_gap(times: Sequence[float], start: float, end: float) -> float | None:
    """The longest wait between two consecutive tokens that overlaps ``[start, end]``
    (a wait that began before ``start`` or ended after ``end`` counts whole)."""
    gaps = [b - a for a, b in itertools.pairwise(times) if b >= start and a <= end]
    return max(gaps) if gaps else None


def ratio(ours: float | None, theirs: float | None) -> float | None:
    if ours is None or theirs is None or theirs <= 0:
        return None
    return ours / theirs


def mean(values: Sequence[float | None]) -> float | None:
    real = [v for v in values if v is not None]
    return statistics.fmean(real) if real else None


# --- talking to a server -----------------------------------------------------------------


async def stream_chat(session: aiohttp.ClientSession, base_url: str, body: dict[str, Any],
                      headers: dict[str, str] | None = None,
                      stop_when: asyncio.Event | None = None,
                      into: Stream | None = None,
                      after: tuple[int, asyncio.Event] | None = None) -> Stream:
    """POST a streaming chat completion and record when each content chunk arrived (into
    ``into`` when given, so that a caller can watch it while it runs). ``after`` = (n, event):
    set the event once n tokens have arrived."""
    payload = {**body, "stream": True, "stream_options": {"include_usage": True}}
    result = into or Stream(sent=0.0)
    result.sent = time.monotonic()
    try:
        async with session.post(f"{base_url}/chat/completions", json=payload,
                                headers=headers or {}) as resp:
            if resp.status != 200:
                result.error = f"HTTP {resp.status}: {(await resp.text())[:300]}"
                return result
            async for data in sse.read_payloads(resp.content):
                if sse.is_done(data):
                    break
                chunk = json.loads(data)
                if isinstance(chunk.get("usage"), dict):
                    result.usage = chunk["usage"]
                for choice in chunk.get("choices") or ():
                    piece = (choice.get("delta") or {}).get("content")
                    if piece:
                        result.token_times.append(time.monotonic())
                        result.text += piece
                        if after is not None and len(result.token_times) >= after[0]:
                            after[1].set()
                if stop_when is not None and stop_when.is_set():
                    break  # leaving closes the connection: the server cancels
    except (aiohttp.ClientError, TimeoutError, ValueError) as e:
        result.error = f"{type(e).__name__}: {e}"
    return result


@dataclass
class Target:
    name: str
    base_url: str
    headers: dict[str, str]
    model: str


async def conversation(session: aiohttp.ClientSession, targets: Sequence[Target],
                       system: str, turns: int, max_tokens: int) -> dict[str, list[Any]]:
    """The same conversation with every target, turn by turn (targets alternate, so that
    the machine's changing load weighs on each alike); each target's own answers are
    appended, as an agent would."""
    messages = {t.name: [{"role": "system", "content": system}] for t in targets}
    rows: dict[str, list[Any]] = {t.name: [] for t in targets}
    for turn in range(turns):
        for t in targets:
            history = messages[t.name]
            history.append({"role": "user", "content": QUESTIONS[turn % len(QUESTIONS)]})
            body = {"model": t.model, "messages": history, "tools": TOOLS,
                    "tool_choice": "auto", "max_tokens": max_tokens, "temperature": 0}
            s = await stream_chat(session, t.base_url, body, t.headers)
            row = {"turn": turn + 1, "ttft_s": s.ttft, "decode_tok_s": s.decode_rate(),
                   "prompt_tokens": s.usage.get("prompt_tokens"),
                   "cached_tokens": s.cached_tokens,
                   "completion_tokens": s.completion_tokens, "error": s.error}
            rows[t.name].append(row)
            print(f"  {t.name} turn {turn + 1}: " + _fmt_row(row), flush=True)
            history.append({"role": "assistant", "content": s.text})
    return rows


async def concurrent(session: aiohttp.ClientSession, t: Target, level: int,
                     max_tokens: int) -> dict[str, Any]:
    bodies = [{"model": t.model, "max_tokens": max_tokens, "temperature": 0,
               "logit_bias": NO_EOS,
               "messages": [{"role": "user", "content": f"Tell story number {i} about a cat."}]}
              for i in range(level)]
    started = time.monotonic()
    streams = await asyncio.gather(*(stream_chat(session, t.base_url, b, t.headers)
                                     for b in bodies))
    wall = time.monotonic() - started
    tokens = sum(s.completion_tokens for s in streams)
    row = {"concurrency": level, "tokens": tokens, "wall_s": wall,
           "aggregate_tok_s": tokens / wall if wall > 0 else None,
           "errors": [s.error for s in streams if s.error]}
    print(f"  {t.name} concurrency {level}: {tokens} tokens in {wall:.1f}s = "
          f"{_num(row['aggregate_tok_s'])} tok/s", flush=True)
    return row


async def starvation(session: aiohttp.ClientSession, t: Target, long_tokens: int,
                     topic: str) -> dict[str, Any]:
    """A short stream decodes; a long new prompt arrives; the short stream's largest gap."""
    short_started, done = asyncio.Event(), asyncio.Event()  # 3 short tokens; long answered
    short_body = {"model": t.model, "max_tokens": 4000, "temperature": 0, "logit_bias": NO_EOS,
                  "messages": [{"role": "user", "content": "Count upwards from one."}]}

    short_stream = Stream(sent=0.0)
    short_task = asyncio.create_task(stream_chat(session, t.base_url, short_body, t.headers,
                                                 stop_when=done, into=short_stream,
                                                 after=(3, short_started)))
    watcher = asyncio.create_task(short_started.wait())
    await asyncio.wait({short_task, watcher}, return_when=asyncio.FIRST_COMPLETED)
    watcher.cancel()
    long_body = {"model": t.model, "max_tokens": 1, "temperature": 0,
                 "messages": [{"role": "user", "content": long_document(long_tokens, topic)
                               + "\nSummarise the log."}]}
    long = await stream_chat(session, t.base_url, long_body, t.headers)
    done.set()
    await short_task
    end = long.token_times[0] if long.token_times else time.monotonic()
    gap = largest_gap(short_stream.token_times, long.sent, end)
    row = {"long_prompt_tokens": long.usage.get("prompt_tokens"), "long_ttft_s": long.ttft,
           "short_tokens_during_prefill": sum(long.sent <= x <= end
                                               for x in short_stream.token_times),
           "largest_gap_s": gap, "short_ended_early": bool(short_stream.token_times)
           and short_stream.token_times[-1] < end,
           "errors": [e for e in (long.error, short_stream.error) if e]}
    print(f"  {t.name} starvation: long prompt {row['long_prompt_tokens']} tokens, first token "
          f"after {_num(long.ttft)}s; short stream: {row['short_tokens_during_prefill']} tokens "
          f"meanwhile, largest gap {_num(gap)}s", flush=True)
    return row


async def measure(targets: Sequence[Target], args: argparse.Namespace) -> dict[str, Any]:
    """Every phase with every target, one target at a time, alternating."""
    timeout = aiohttp.ClientTimeout(total=REQUEST_TIMEOUT)
    out: dict[str, dict[str, Any]] = {t.name: {} for t in targets}
    async with aiohttp.ClientSession(timeout=timeout) as session:
        for t in targets:  # warm-up: first-call costs are not a turn
            await stream_chat(session, t.base_url, {"model": t.model, "max_tokens": 2,
                              "messages": [{"role": "user", "content": "Hi"}]}, t.headers)
        turns = await conversation(session, targets, system_prompt(args.system_tokens),
                                   args.turns, args.max_tokens)
        rounds: dict[str, list[dict[str, Any]]] = {t.name: [] for t in targets}
        for _ in range(args.rounds):
            for t in targets:
                rounds[t.name].append(
                    await concurrent(session, t, args.concurrency, args.concurrent_tokens))
        for t in targets:
            out[t.name]["turns"] = turns[t.name]
            out[t.name]["throughput"] = {
                "concurrency": args.concurrency,
                "aggregate_tok_s": mean([r["aggregate_tok_s"] for r in rounds[t.name]]),
                "rounds": rounds[t.name]}
        for t in targets:
            out[t.name]["starvation"] = await starvation(session, t, args.long_tokens, "build")
    return out


# --- the servers -------------------------------------------------------------------------


@contextlib.asynccontextmanager
async def mlx_lm_server(model_dir: Path, log_path: Path) -> AsyncIterator[str]:
    """``python -m mlx_lm.server --model DIR`` on a free port; yields its ``/v1`` URL."""
    from router.lanes.blas import preload_env

    port = procs.free_port()
    env = {**os.environ, **preload_env()}  # the same BLAS as the lanes
    with log_path.open("wb") as log:
        proc = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "mlx_lm.server", "--model", str(model_dir),
            "--host", "127.0.0.1", "--port", str(port),
            stdout=log, stderr=log, env=env, start_new_session=True)
        try:
            await procs.wait_http(f"http://127.0.0.1:{port}/v1/models", proc,
                                  MLX_START_DEADLINE)
            yield f"http://127.0.0.1:{port}/v1"
        finally:
            await procs.stop_group(proc)


async def run(args: argparse.Namespace) -> dict[str, Any]:
    from router.lanes.modelprep import ensure_default_models

    model_dir = Path(args.model) if args.model else ensure_default_models(quiet=True)[0]
    args.out.parent.mkdir(parents=True, exist_ok=True)
    print(f"starting mlx_lm.server and speclane on {model_dir}", flush=True)
    lanes = launch.LaneOptions(model=str(model_dir), max_batch_size=max(8, args.concurrency))
    async with (mlx_lm_server(model_dir, args.out.with_suffix(".mlx_lm.log")) as mlx_url,
                launch.own_router(lanes, args.out.with_suffix(".router.log")) as url):
        async with aiohttp.ClientSession() as session:
            models = await environment.served_models(session, url)
        targets = [Target("mlx_lm.server", mlx_url, {}, "default_model"),  # its --model
                   Target("speclane", url, dict(LANE_HEADERS), (models or [model_dir.name])[0])]
        results = await measure(targets, args)
    return {
        "bench": "agent", "date": environment.now_iso(), "model": str(model_dir),
        "settings": {k: v for k, v in vars(args).items() if k != "out"},
        "environment": {"versions": environment.versions(), "hardware": environment.hardware(),
                        "load_average": environment.load_average()},
        "results": results, "ratios": ratios(results),
    }


def ratios(results: dict[str, Any]) -> dict[str, Any]:
    ours, theirs = results.get("speclane", {}), results.get("mlx_lm.server", {})

    def later_ttft(r: dict[str, Any]) -> float | None:
        return mean([row["ttft_s"] for row in r.get("turns", []) if row["turn"] >= 2])

    gap = (ours.get("starvation") or {}).get("largest_gap_s")
    return {
        "turn2plus_ttft": ratio(later_ttft(ours), later_ttft(theirs)),
        "aggregate_throughput": ratio((ours.get("throughput") or {}).get("aggregate_tok_s"),
                                      (theirs.get("throughput") or {}).get("aggregate_tok_s")),
        "largest_gap_s": gap,
        "goals_met": {
            "turn2plus_ttft<=1.0": _le(ratio(later_ttft(ours), later_ttft(theirs)), 1.0),
            "aggregate_throughput>=1.0": _ge(ratio(
                (ours.get("throughput") or {}).get("aggregate_tok_s"),
                (theirs.get("throughput") or {}).get("aggregate_tok_s")), 1.0),
            f"largest_gap<{GAP_GOAL:g}s": None if gap is None else gap < GAP_GOAL,
        },
    }


def _le(value: float | None, bound: float) -> bool | None:
    return None if value is None else value <= bound


def _ge(value: float | None, bound: float) -> bool | None:
    return None if value is None else value >= bound


def _num(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}"


def _fmt_row(row: dict[str, Any]) -> str:
    return (f"TTFT {_num(row['ttft_s'])}s, decode {_num(row['decode_tok_s'])} tok/s, "
            f"prompt {row['prompt_tokens']} (cached {row['cached_tokens']})"
            + (f", error {row['error']}" if row["error"] else ""))


def render(report: dict[str, Any]) -> str:
    lines = ["| target | turn | TTFT s | decode tok/s | prompt | cached |",
             "|---|---:|---:|---:|---:|---:|"]
    for name, r in report["results"].items():
        for row in r["turns"]:
            lines.append(f"| {name} | {row['turn']} | {_num(row['ttft_s'])} | "
                         f"{_num(row['decode_tok_s'])} | {row['prompt_tokens']} | "
                         f"{row['cached_tokens']} |")
    lines += ["", "| target | aggregate tok/s (concurrency) | long prompt tokens | "
              "short stream tokens during its prefill | largest gap s |",
              "|---|---:|---:|---:|---:|"]
    for name, r in report["results"].items():
        tp, st = r["throughput"], r["starvation"]
        lines.append(f"| {name} | {_num(tp['aggregate_tok_s'])} ({tp['concurrency']}) | "
                     f"{st['long_prompt_tokens']} | {st['short_tokens_during_prefill']} | "
                     f"{_num(st['largest_gap_s'])} |")
    rt = report["ratios"]
    lines += ["", f"turn 2+ TTFT ratio {_num(rt['turn2plus_ttft'])} (goal <= 1.0); aggregate "
              f"throughput ratio {_num(rt['aggregate_throughput'])} (goal >= 1.0); largest gap "
              f"{_num(rt['largest_gap_s'])}s (goal < {GAP_GOAL:g}s)"]
    return "\n".join(lines)


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(
        prog="speclane bench agent",
        description="An agent conversation against speclane's batching lane and mlx_lm.server.")
    p.add_argument("--model", help="mlx-lm model directory (default: the prepared default)")
    p.add_argument("--system-tokens", type=int, default=1000,
                   help="approximate size of the system prompt (default 1000)")
    p.add_argument("--turns", type=int, default=3)
    p.add_argument("--max-tokens", type=int, default=24, help="per turn (default 24)")
    p.add_argument("--concurrency", type=int, default=4)
    p.add_argument("--concurrent-tokens", type=int, default=24)
    p.add_argument("--rounds", type=int, default=2,
                   help="concurrency rounds per target, alternating (default 2)")
    p.add_argument("--long-tokens", type=int, default=800,
                   help="approximate size of the long prompt of the starvation test")
    p.add_argument("--out", type=Path, default=Path("bench-results/agent.json"))
    args = p.parse_args(argv)
    report = asyncio.run(run(args))
    args.out.write_text(json.dumps(report, indent=2) + "\n", encoding="utf-8")
    print()
    print(render(report))
    print(f"\nwritten to {args.out}")
    return 0


