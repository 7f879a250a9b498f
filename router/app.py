"""make_app(): the route table, middlewares, and every resource as a cleanup context."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator

import aiohttp
from aiohttp import web

from router.admin import setup_admin_routes
from router.appkeys import (
    LIMITER,
    METRICS,
    POLICIES,
    POOL,
    RELAY,
    ROUTING,
    SESSION,
    SETTINGS,
    SPEC,
    RoutingState,
)
from router.backends.base import Backend
from router.backends.health import HealthMonitor
from router.backends.pool import BackendPool
from router.backends.scrape import CumulativeScraper
from router.config.policies import PolicySet, load_policies
from router.config.settings import Settings
from router.config.watch import PolicyWatcher
from router.lanes.group import lanes_context
from router.metrics import Metrics
from router.proxy.admission import ConcurrencyLimiter
from router.proxy.handlers import setup_routes
from router.proxy.middleware import error_middleware
from router.proxy.relay import Relay
from router.proxy.telemetry import SpecTelemetry
from router.proxy.upstream import Http1Pool

log = logging.getLogger("speclane")


def make_app(settings: Settings, *, metrics: Metrics | None = None) -> web.Application:
    """Build the app; raises PolicyError when the policy set is invalid (serve refuses)."""
    app = web.Application(client_max_size=settings.max_body_bytes, middlewares=[error_middleware])
    app[SETTINGS] = settings
    app[METRICS] = metrics = metrics or Metrics()
    app[POOL] = BackendPool([Backend.from_spec(b, settings.cooldown) for b in settings.backends])
    app[POLICIES] = PolicyWatcher(settings.policies_dir, initial_policies(settings),
                                  presets=settings.presets.keys(), metrics=metrics,
                                  interval=settings.policy_poll_interval)
    app[LIMITER] = ConcurrencyLimiter(metrics)
    app[ROUTING] = RoutingState(gate=settings.routing.new_gate())
    app[SPEC] = SpecTelemetry(settings, metrics, app[POOL], lambda: app[POLICIES].current)
    for backend in app[POOL]:
        metrics.spec_requested.labels(backend.name).set(1 if backend.speculative_requested else 0)
    setup_routes(app)
    setup_admin_routes(app)
    app.on_shutdown.append(finish_in_flight)
    app.cleanup_ctx.append(client_session)
    app.cleanup_ctx.append(health_monitor)
    app.cleanup_ctx.append(cumulative_scraper)
    app.cleanup_ctx.append(policy_reloads)
    app.cleanup_ctx.append(lanes_context)
    return app


async def finish_in_flight(app: web.Application) -> None:
    """On shutdown: refuse new requests, give the running ones ``shutdown_grace`` seconds,
    then end streams with an error event (aiohttp alone would cut them silently)."""
    await app[RELAY].shutdown(app[SETTINGS].shutdown_grace)


def initial_policies(settings: Settings) -> PolicySet:
    directory = settings.policies_dir
    if not directory.exists() and "policies_dir" not in settings.model_fields_set:
        log.warning("no policies directory at %s: every client gets the permissive default",
                    directory.resolve())
        return PolicySet.implied()
    policies = load_policies(directory, presets=settings.presets.keys())
    for warning in policies.warnings:
        log.warning("policies: %s", warning)
    return policies


async def policy_reloads(app: web.Application) -> AsyncIterator[None]:
    watcher = app[POLICIES]
    task = None
    if watcher.directory.is_dir():
        task = asyncio.create_task(watcher.run(), name="speclane-policy-watch")
        watcher.install_sighup()
    yield
    if task:
        watcher.remove_sighup()
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


async def client_session(app: web.Application) -> AsyncIterator[None]:
    # No connection limit: admission control and per-client limits decide concurrency,
    # and a pool limit here would queue streams invisibly.
    connector = aiohttp.TCPConnector(limit=0, keepalive_timeout=30, enable_cleanup_closed=True)
    # Ask upstreams for identity encoding: compressing on loopback only costs CPU.
    session = aiohttp.ClientSession(connector=connector,
                                    skip_auto_headers=("User-Agent", "Accept-Encoding"))
    app[SESSION] = session  # health checks and scraping
    bounds = app[SETTINGS].upstream
    client = Http1Pool(keepalive=30.0,  # the relay's own: see router.proxy.upstream for why
                       max_body=bounds.max_body_bytes, head_timeout=bounds.head_timeout,
                       max_trailer=bounds.max_trailer_bytes)
    app[RELAY] = Relay(client, app[POOL], app[SETTINGS].retry, app[METRICS])
    yield
    await app[RELAY].close()
    await client.close()
    await session.close()


async def cumulative_scraper(app: web.Application) -> AsyncIterator[None]:
    scraper = CumulativeScraper(app[POOL], app[SESSION], app[SETTINGS].spec.scrape_interval,
                                app[SPEC].observe_cumulative)
    scraper.start()
    yield
    await scraper.stop()


# How long start-up waits for the first health check of the external backends (they are
# probed together): long enough for any backend that is up, short of a hung one's timeout.
STARTUP_HEALTH_WAIT = 2.0


async def health_monitor(app: web.Application) -> AsyncIterator[None]:
    monitor = HealthMonitor(app[POOL], app[SESSION], app[METRICS], app[SETTINGS].health_interval)
    await monitor.start(wait=STARTUP_HEALTH_WAIT)
    yield
    await monitor.stop()
