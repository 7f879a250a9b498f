"""A FakeUpstream in a process of its own, so that a test can SIGKILL a backend mid-stream.

python -m tests.reliability.upstream_proc --chunks 2000 --interval 0.02
# prints "FAKE_UPSTREAM_READY <port>" once listening
"""

from __future__ import annotations

import argparse
import asyncio

from tests.fakes.upstream import Behaviour, FakeUpstream


async def main(args: argparse.Namespace) -> None:
    fake = FakeUpstream(
        name=args.name, behaviour=Behaviour(chunks=args.chunks, interval=args.interval)
    )
    await fake.start()
    print(f"FAKE_UPSTREAM_READY {fake.port}", flush=True)
    await asyncio.Event().wait()


if __name__ == "__main__":
    p = argparse.ArgumentParser()
    p.add_argument("--name", default="victim")
    p.add_argument("--chunks", type=int, default=2000)
    p.add_argument("--interval", type=float, default=0.02)
    asyncio.run(main(p.parse_args()))
