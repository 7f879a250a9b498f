"""The router's CPU time per second of wall time while it serves nothing (the bench
configuration: no lanes, one openai backend, the synthetic upstream).

Under callgrind, which runs the router about 50x slower, whatever it does per second of
wall time (timers, polls, samplers) is counted into every stream of a measured run, so an
idle cost that is negligible natively can be a large share of ``instructions per stream``.

    PYTHONPATH=$PWD python examples/profiling/idle_cpu.py [--seconds 20]
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import sys
import tempfile
import time

from aiohttp import web
from benchconfig import bench_config  # examples/profiling/, the script's own folder

from router.app import make_app
from router.bench.common import procs
from router.config.settings import load_settings
from router.server import GC_THRESHOLDS, event_loop_factory

try:
    from router.observability.logfmt import setup_logging
    from router.proxy.connections import GuardedRunner as Runner
except ImportError:  # an older tree, to compare
    from aiohttp.web import AppRunner as Runner  # type: ignore[assignment]

    from router.server import setup_logging  # type: ignore[attr-defined,no-redef]


async def run(seconds: float) -> None:
    async with procs.bench_upstream() as upstream:
        with tempfile.TemporaryDirectory(prefix="speclane-idle-") as tmp:
            settings = load_settings(bench_config(tmp, upstream.url), port=0)
            app = make_app(settings)
            kwargs = {"access_log": None}
            runner = (
                Runner(app, settings.client_limits, 1024, **kwargs)  # type: ignore[call-arg]
                if Runner is not web.AppRunner
                else Runner(app, **kwargs)
            )
            await runner.setup()
            try:
                await web.TCPSite(runner, "127.0.0.1", 0).start()
                await asyncio.sleep(3)  # start-up settles
                cpu, wall = time.process_time(), time.monotonic()
                await asyncio.sleep(seconds)
                cpu, wall = time.process_time() - cpu, time.monotonic() - wall
                print(f"idle router CPU: {cpu / wall * 1e3:.2f} ms per second")
            finally:
                await runner.cleanup()


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--seconds", type=float, default=20.0)
    args = p.parse_args(argv)
    setup_logging("warning")
    gc.set_threshold(*GC_THRESHOLDS)
    with asyncio.Runner(loop_factory=event_loop_factory()) as r:
        r.run(run(args.seconds))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
