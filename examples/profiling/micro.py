"""Per-call cost (no profiler) of the per-request pieces of the hot path, on the bench's
7-token request and answer. ``PYTHONPATH=$PWD python examples/profiling/micro.py``."""

from __future__ import annotations

import timeit

from router.bench.common.upstream import stream_body, stream_events
from router.kernel.sse import SSETail
from router.proxy import relay as relay_mod
from router.proxy.request import parse_request
from router.routing.affinity import fingerprints
from router.speculation.families import classify_family

RAW = stream_body(7)
CHUNK = b"".join(stream_events(7))


def bench(name: str, fn, number: int = 20000) -> None:
    best = min(timeit.repeat(fn, number=number, repeat=5)) / number
    print(f"{name:40s} {best * 1e6:8.2f} us")


def main() -> None:
    parsed = parse_request("chat", RAW)
    bench("parse_request", lambda: parse_request("chat", RAW))
    bench("classify_family", lambda: classify_family(parsed.data))
    bench("fingerprints", lambda: fingerprints("chat", parsed.data))
    bench("_DONE_LINE.search", lambda: relay_mod._DONE_LINE.search(CHUNK))
    tail = SSETail()
    tail.feed(CHUNK)
    bench("SSETail.finish", tail.finish)


if __name__ == "__main__":
    main()
