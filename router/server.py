"""Run the router until SIGINT/SIGTERM, then shut down gracefully (``speclane serve``:
``router.cli.serve``).

Shutdown order: keep the listener open but answer new requests 503 while in-flight
requests finish for up to ``shutdown_grace`` seconds (a second signal ends that at once),
cancel what is left (streams end with an error event), close the listener, then the
cleanup contexts stop the lane workers and close the client session.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
import sys
from collections.abc import Callable
from pathlib import Path

from aiohttp import web

from router.app import wire
from router.config.policies import PolicyError
from router.config.settings import Settings
from router.lanes.group import LaneStartupError
from router.proxy.connections import FD_RESERVE, GuardedRunner, connection_cap, raise_fd_limit
from router.proxy.hosts import WILDCARD_BINDS
from router.proxy.localtoken import remove_token, write_token
from router.proxy.relay import Relay
from router.proxy.services import Services

log = logging.getLogger("speclane")


async def run(settings: Settings, ready: asyncio.Event | None = None) -> None:
    try:
        app, services = wire(settings)
    except PolicyError as e:
        raise StartupError(f"invalid policies in {settings.policies_dir}:\n{e}") from e
    limits = settings.client_limits
    cap = connection_cap(
        limits.max_connections, raise_fd_limit(2 * limits.max_connections + FD_RESERVE)
    )
    if cap < limits.max_connections:
        log.warning(
            "client_limits.max_connections lowered from %d to %d to fit the process's "
            "file-descriptor limit (ulimit -n)",
            limits.max_connections,
            cap,
        )
    runner = GuardedRunner(
        app,
        limits,
        cap,
        handler_cancellation=True,
        shutdown_timeout=settings.shutdown_grace,
        access_log=None,
    )
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    warn_if_exposed(settings, services)
    token_file: Path | None = None
    try:
        await runner.setup()
    except LaneStartupError as e:
        await runner.cleanup()
        raise StartupError(str(e)) from None
    try:
        site = web.TCPSite(
            runner, settings.host, settings.port, shutdown_timeout=settings.shutdown_grace
        )
        try:
            await site.start()
        except OSError as e:  # port in use, address not on this machine, no permission
            raise StartupError(
                f"cannot listen on {settings.host}:{settings.port}: {e.strerror or e}"
            ) from None
        port = runner.addresses[0][1]
        token_file = publish_local_token(services.local_token, port)
        base = f"http://{_display_host(settings.host)}:{port}/v1"
        print(f"speclane listening on {base}", flush=True)
        print(curl_example(base, services), flush=True)
        log.info("listening on %s", base)
        if not is_loopback_host(settings.host) and "*" not in settings.allowed_hosts:
            bound = (
                "an IP address, this machine's host name"
                if settings.host in WILDCARD_BINDS
                else settings.host
            )
            log.info(
                "requests must name this router (Host) by a loopback name, %s or an "
                "allowed_hosts entry (%s); other names get 421",
                bound,
                ", ".join(settings.allowed_hosts) or "none set",
            )
        if ready:
            ready.set()
        await stop.wait()
        await drain(services.relay, settings.shutdown_grace, stop)
    finally:
        await runner.cleanup()
        if token_file is not None:
            remove_token(token_file, services.local_token)
        log.info("stopped")


def publish_local_token(token: str, port: int) -> Path | None:
    """Write the run's local admin token for ``speclane policy reload`` (best effort: a
    read-only home only costs that command its key-less mode)."""
    try:
        return write_token(port, token)
    except OSError as e:
        log.warning(
            "cannot write the local admin token (%s); 'speclane policy reload' "
            "will need --admin-key",
            e,
        )
        return None


async def drain(relay: Relay, grace: float, stop: asyncio.Event) -> None:
    """The grace period, with the listener still open: a new request is answered 503
    (code "shutting_down", so a client knows to go elsewhere or retry later) instead of a
    refused connection, and requests in flight get up to ``grace`` seconds. A second
    SIGINT/SIGTERM (Ctrl-C again) ends the grace period at once. The listener closes after
    this, when the runner is cleaned up."""
    log.info(
        "shutting down: finishing in-flight requests (up to %.0fs; new requests get "
        "503; Ctrl-C again to stop now)",
        grace,
    )
    stop.clear()
    graceful = asyncio.create_task(relay.shutdown(grace))
    again = asyncio.create_task(stop.wait())
    try:
        await asyncio.wait({graceful, again}, return_when=asyncio.FIRST_COMPLETED)
        if not graceful.done():
            log.warning("second signal: ending the grace period now")
            graceful.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await graceful
            await relay.shutdown(0)
    finally:
        again.cancel()


def is_loopback_host(host: str) -> bool:
    return host in ("localhost", "::1") or host.startswith("127.")


def warn_if_exposed(settings: Settings, services: Services) -> None:
    """A router on the network that lets anyone in without a key must say so loudly.

    "Anyone in" is the key rule itself (``PolicySet.keyless``), not a second reading of it.
    """
    if is_loopback_host(settings.host):
        return
    keyless = services.policies.current.keyless()
    if not keyless and settings.admin_key is not None:
        return
    problems = []
    if keyless:
        names = ", ".join(p.client for p in keyless)
        problems.append(
            "any client without an API key is served (the 'default' policy does "
            f"not set require_api_key; open policies: {names})"
        )
    if settings.admin_key is None:
        problems.append("admin endpoints stay loopback-only because no admin_key is set")
    banner = "!" * 78
    lines = [
        banner,
        f"WARNING: speclane is listening on {settings.host}, reachable from other machines,",
        *[f"  - {p}" for p in problems],
        "  Set require_api_key = true in policies/default.toml (and keys per client),",
        "  or bind to 127.0.0.1 (the default).",
        banner,
    ]
    print("\n".join(lines), file=sys.stderr, flush=True)
    log.warning("listening on a non-loopback address without API keys")


def curl_example(base: str, services: Services) -> str:
    models = services.pool.models()
    model = models[0][0] if models else "MODEL"
    return (
        "try it:\n"
        f"  curl -s {base}/chat/completions -H 'Content-Type: application/json' \\\n"
        f'    -d \'{{"model": "{model}", "messages": '
        '[{"role": "user", "content": "What is the capital of France?"}]}\''
    )


def event_loop_factory() -> Callable[[], asyncio.AbstractEventLoop] | None:
    """uvloop when installed: it roughly halves the relay's per-chunk socket cost."""
    try:
        import uvloop
    except ImportError:
        return None
    return uvloop.new_event_loop


def _display_host(host: str) -> str:
    return "127.0.0.1" if host in ("0.0.0.0", "") else (f"[{host}]" if ":" in host else host)


# With the default first-generation threshold (700 net container allocations) the
# collector runs very often under load, while many requests' objects are alive; 10,000
# keeps the same collector with far fewer runs: fewer instructions per relayed short
# stream (counted under callgrind, examples/results/overhead.md), for a little more garbage
# waiting.
GC_THRESHOLDS = (10_000, 10, 10)


class StartupError(Exception):
    """Raised by a cleanup context that cannot bring the router up (lanes, policies)."""
