"""Instructions the router executes per relayed stream, counted by valgrind's callgrind.

Timings on a shared machine move with its neighbours by 10-20% from one run to the next;
an instruction count barely does (two runs of the same code agree within about 0.5%, as
reads coalesce a little differently). This is how a change to the hot path is judged
before ``speclane bench overhead`` measures it in time: count before, count after. It
runs the same synthetic upstream and the same speclane configuration as that benchmark,
with speclane under callgrind (about 50x slower, so the load generator keeps
``--concurrency`` streams in flight at all times), warms it up, then counts only the
``--streams`` measured ones.

    sudo apt-get install valgrind
    .venv/bin/python examples/count_instructions.py [--streams 600] [--concurrency 64]
                                                    [--tokens 7] [--out FILE]

Prints ``instructions per stream`` and saves JSON. Linux only (valgrind).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import aiohttp

from router.bench.common import procs
from router.bench.common.upstream import stream_body

WARMUP_STREAMS = 200


async def relay_streams(base_url: str, streams: int, concurrency: int, tokens: int) -> None:
    """Exactly ``streams`` streams, ``concurrency`` at a time, each read to its end."""
    body = stream_body(tokens)
    left = streams

    async def one_after_another(session: aiohttp.ClientSession) -> None:
        nonlocal left
        while left > 0:
            left -= 1
            async with session.post(
                f"{base_url}/chat/completions",
                data=body,
                headers={"Content-Type": "application/json"},
            ) as resp:
                text = await resp.read()
                if resp.status != 200 or not text.rstrip().endswith(b"data: [DONE]"):
                    raise RuntimeError(f"stream failed: {resp.status} {text[-200:]!r}")

    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as session:
        await asyncio.gather(*(one_after_another(session) for _ in range(concurrency)))


def callgrind_total(dump: Path) -> int:
    for line in dump.read_text().splitlines():
        if line.startswith(("summary:", "totals:")):
            return int(line.split()[1])
    raise RuntimeError(f"no instruction total in {dump}")


def latest_dump(directory: Path) -> Path:
    """callgrind numbers its dumps (``callgrind.out.1``, ``.2``, ...): the last one."""
    return max(directory.glob("callgrind.out.*"), key=lambda p: int(p.name.rsplit(".", 1)[1]))


def control(*args: str) -> None:
    subprocess.run(["callgrind_control", *args], check=True, capture_output=True)


async def count(streams: int, concurrency: int, tokens: int) -> int:
    with tempfile.TemporaryDirectory(prefix="speclane-callgrind-") as tmp:
        out = Path(tmp) / "callgrind.out"
        prefix = [
            "valgrind",
            "--tool=callgrind",
            f"--callgrind-out-file={out}",
            "--dump-instr=no",
            "--collect-jumps=no",
        ]
        async with (
            procs.bench_upstream() as upstream,
            procs.speclane_router(upstream.url, prefix=prefix, deadline=600) as router,
        ):
            await relay_streams(router.url, WARMUP_STREAMS, concurrency, tokens)
            control("-z", str(router.sid))  # forget start-up and warm-up
            await relay_streams(router.url, streams, concurrency, tokens)
            control("-d", str(router.sid))
            return callgrind_total(latest_dump(Path(tmp)))


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--streams", type=int, default=600)
    p.add_argument("--concurrency", type=int, default=64)
    p.add_argument("--tokens", type=int, default=7)
    p.add_argument("--out", type=Path, default=Path("bench-results/instructions.json"))
    args = p.parse_args(argv)
    missing = [tool for tool in ("valgrind", "callgrind_control") if not shutil.which(tool)]
    if missing:
        print(f"needs {' and '.join(missing)} (apt-get install valgrind)", file=sys.stderr)
        return 2
    total = asyncio.run(count(args.streams, args.concurrency, args.tokens))
    per_stream = total / args.streams
    print(
        f"speclane: {per_stream / 1000:,.0f} k instructions per stream "
        f"({args.streams} streams of {args.tokens} tokens, {args.concurrency} at a time)"
    )
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(
        json.dumps(
            {
                "benchmark": "instructions",
                "date": time.strftime("%Y-%m-%d"),
                "streams": args.streams,
                "concurrency": args.concurrency,
                "tokens": args.tokens,
                "instructions_per_stream": per_stream,
            },
            indent=2,
        )
        + "\n"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
