"""Per-call cost (no profiler) of each per-request step of ``router.proxy.handlers.proxy``
outside the network, on the bench configuration (no lanes, one openai backend) and its
7-token request and answer. ``PYTHONPATH=$PWD python examples/profiling/pipeline.py``.

Each step is timed alone, best of 5 repeats, so a change to one of them shows up here
within a few percent even on a shared machine.
"""

from __future__ import annotations

import tempfile
import time
import timeit
from pathlib import Path

from aiohttp.test_utils import make_mocked_request
from multidict import CIMultiDict

from router.app import wire
from router.bench.common.upstream import stream_body, stream_events
from router.config.settings import load_settings
from router.kernel.sse import SSETail
from router.proxy import observe
from router.proxy.accesslog import record_of
from router.proxy.handlers import decide, identify
from router.proxy.headers import decision_headers
from router.proxy.outcome import Outcome
from router.proxy.request import parse_request

RAW = stream_body(7)
CHUNK = b"".join(stream_events(7))


def bench(name: str, fn, number: int = 5000) -> float:
    best = min(timeit.repeat(fn, number=number, repeat=5)) / number
    print(f"{name:28s} {best * 1e6:8.2f} us")
    return best


def main() -> None:
    with tempfile.TemporaryDirectory() as tmp:
        config = Path(tmp) / "speclane.toml"
        (Path(tmp) / "policies").mkdir()
        config.write_text(
            f'policies_dir = "{tmp}/policies"\nlog_level = "warning"\n[lanes]\nenabled = false\n'
            '[[backends]]\nname = "bench"\nkind = "openai"\nbase_url = "http://127.0.0.1:9/v1"\n'
        )
        settings = load_settings(config, port=0)
        app, services = wire(settings)
        backend = next(iter(services.pool))
        backend.probe_succeeded(frozenset({"bench-model"}))
        request = make_mocked_request(
            "POST",
            "/v1/chat/completions",
            app=app,
            headers=CIMultiDict({"Content-Type": "application/json", "Host": "x"}),
        )
        policy = identify(services, request)
        tail = SSETail()
        tail.feed(CHUNK)

        def finished_outcome() -> Outcome:
            parsed = parse_request("chat", RAW)
            result, _ = decide(services, request, parsed, policy)
            o = Outcome(
                endpoint="chat",
                arrival=time.monotonic(),
                status=200,
                backend=backend,
                candidate=result.decision.candidates[0],
                tried=backend,
                stream=True,
                attempts=1,
                completed=True,
                delivered=True,
            )
            o.first_byte_at = o.last_byte_at = o.finished_at = time.monotonic()
            o.tail_events, _, _ = tail.finish()
            return o

        outcome = finished_outcome()
        parsed = parse_request("chat", RAW)
        result, claim = decide(services, request, parsed, policy)
        total = 0.0
        total += bench("identify", lambda: identify(services, request))
        total += bench("parse_request", lambda: parse_request("chat", RAW))
        # the same parsed request each time: the bench configuration changes no field
        total += bench("decide", lambda: decide(services, request, parsed, policy))
        total += bench("decision_headers", lambda: decision_headers(result, 0.001, 0.0))
        total += bench("SSETail.finish", tail.finish)
        total += bench("observe.record", lambda: observe.record(services.metrics, outcome))
        total += bench(
            "counts.answer+spec.complete",
            lambda: services.spec.complete(
                outcome, claim, services.counts.answer(outcome, *claim.names(outcome))
            ),
        )
        total += bench(
            "record_of+add",
            lambda: services.access.add(
                record_of(outcome, client="default", model="bench-model", decision="x")
            ),
        )
        print(f"{'sum':28s} {total * 1e6:8.2f} us")


if __name__ == "__main__":
    main()
