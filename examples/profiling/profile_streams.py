"""cProfile speclane's router, in this process, relaying short streams from the synthetic
upstream of ``bench overhead`` / ``examples/count_instructions.py`` (same configuration:
no lanes, one openai backend, log level warning). The load generator runs in its own
process (``loadgen.py``) so that the profile holds the router alone.

    PYTHONPATH=$PWD python examples/profiling/profile_streams.py [--streams 3000]
        [--concurrency 64] [--tokens 7] [--out examples/profiling/streams.pstats]

Prints the top functions by self time (all, then speclane's own ``router/`` code), or with
``--cpu-only`` the router's CPU time per stream, unprofiled.
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import gc
import pstats
import resource
import sys
import tempfile
from pathlib import Path

from aiohttp import web
from benchconfig import bench_config  # examples/profiling/, the script's own folder

from router.app import make_app
from router.bench.common import procs
from router.config.settings import load_settings
from router.observability.logfmt import setup_logging
from router.proxy.connections import GuardedRunner
from router.server import GC_THRESHOLDS, event_loop_factory

HERE = Path(__file__).resolve().parent


async def load(url: str, streams: int, concurrency: int, tokens: int) -> None:
    proc = await asyncio.create_subprocess_exec(
        sys.executable, str(HERE / "loadgen.py"), url, str(streams), str(concurrency), str(tokens)
    )
    if await proc.wait() != 0:
        raise RuntimeError("load generator failed")


async def run(args: argparse.Namespace, profiler: cProfile.Profile) -> None:
    async with procs.bench_upstream() as upstream:
        with tempfile.TemporaryDirectory(prefix="speclane-prof-") as tmp:
            settings = load_settings(bench_config(tmp, upstream.url), port=0)
            app = make_app(settings)
            runner = GuardedRunner(
                app,
                settings.client_limits,
                1024,
                handler_cancellation=True,
                shutdown_timeout=settings.shutdown_grace,
                access_log=None,
            )
            await runner.setup()
            try:
                site = web.TCPSite(runner, "127.0.0.1", 0)
                await site.start()
                url = f"http://127.0.0.1:{runner.addresses[0][1]}/v1"
                await load(url, 200, args.concurrency, args.tokens)  # warm-up
                cpu = resource.getrusage(resource.RUSAGE_SELF)
                if not args.cpu_only:
                    profiler.enable()
                await load(url, args.streams, args.concurrency, args.tokens)
                profiler.disable()
                end = resource.getrusage(resource.RUSAGE_SELF)
                user, system = end.ru_utime - cpu.ru_utime, end.ru_stime - cpu.ru_stime
                print(
                    f"router CPU per stream: user {user / args.streams * 1e6:.0f} us, "
                    f"system {system / args.streams * 1e6:.0f} us"
                    + ("" if args.cpu_only else " (profiled)")
                )
            finally:
                await runner.cleanup()


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--streams", type=int, default=3000)
    p.add_argument("--concurrency", type=int, default=64)
    p.add_argument("--tokens", type=int, default=7)
    p.add_argument("--top", type=int, default=45)
    p.add_argument(
        "--cpu-only",
        action="store_true",
        help="no profile: the router's CPU time per stream only (noisy: +-10%%)",
    )
    p.add_argument("--out", type=Path, default=HERE / "streams.pstats")
    args = p.parse_args(argv)
    setup_logging("warning")
    gc.set_threshold(*GC_THRESHOLDS)
    profiler = cProfile.Profile()
    with asyncio.Runner(loop_factory=event_loop_factory()) as r:
        r.run(run(args, profiler))
    if args.cpu_only:
        return 0
    profiler.dump_stats(args.out)
    stats = pstats.Stats(str(args.out))
    stats.sort_stats("tottime").print_stats(args.top)
    stats.sort_stats("tottime").print_stats("/router/", args.top)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
