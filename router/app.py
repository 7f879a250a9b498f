"""make_app(): the route table, middlewares, and every resource as a cleanup context."""

from __future__ import annotations

import logging
import sys
from collections.abc import AsyncIterator
from pathlib import Path

import aiohttp
from aiohttp import web

from router.admin import setup_admin_routes
from router.appkeys import (
    LAYOUT,
    LIMITER,
    LOCAL_TOKEN,
    METRICS,
    MODELS,
    POLICIES,
    POOL,
    RELAY,
    ROUTING,
    SESSION,
    SETTINGS,
    SPEC,
    SUPERVISORS,
)
from router.backends.base import Backend
from router.backends.health import HealthMonitor
from router.backends.pool import BackendPool
from router.backends.scrape import CumulativeScraper
from router.config.policies import PolicySet, load_policies
from router.config.policydir import is_packaged
from router.config.settings import Settings
from router.frontdoors.handlers import setup_frontdoor_routes
from router.lanes.group import start_lanes
from router.lanes.models import ModelManager, catalog_for, memory_budget
from router.metrics import Metrics
from router.observability.history import HISTORY, History, history_context
from router.observability.status import setup_status_routes
from router.proxy.accesslog import ACCESS, AccessLog
from router.proxy.admission import ConcurrencyLimiter
from router.proxy.handlers import setup_routes
from router.proxy.hosts import HostRule
from router.proxy.localtoken import new_token
from router.proxy.middleware import browser_guard, error_middleware
from router.proxy.offload import CPU, CpuPool, cpu_context
from router.proxy.policy_watch import PolicyWatcher
from router.proxy.relay import Relay
from router.proxy.telemetry import SpecTelemetry
from router.routing.load import gate_for
from router.routing.state import RoutingState
from router.upstream.client import Http1Pool

log = logging.getLogger("speclane")


def make_app(settings: Settings, *, metrics: Metrics | None = None) -> web.Application:
    """Build the app; raises PolicyError when the policy set is invalid (serve refuses)."""
    hosts = HostRule.build(settings.allowed_hosts, settings.host)
    app = web.Application(
        client_max_size=settings.max_body_bytes,
        middlewares=[error_middleware, browser_guard(hosts)],
    )
    app[SETTINGS] = settings
    app[LOCAL_TOKEN] = new_token()
    app[METRICS] = metrics = metrics or Metrics()
    app[POOL] = BackendPool([Backend.from_spec(b, settings.cooldown) for b in settings.backends])
    app[POLICIES] = PolicyWatcher(
        settings.policies_dir,
        initial_policies(settings),
        presets=settings.presets.keys(),
        spec=settings.spec,
        metrics=metrics,
        interval=settings.policy_poll_interval,
        settle=settings.policy_settle_seconds,
        on_reload=lambda result: app[SPEC].policies_reloaded(result.ok),
    )
    app[LIMITER] = ConcurrencyLimiter(metrics)
    app[ROUTING] = RoutingState(gate=gate_for(settings.routing))
    app[ACCESS] = AccessLog()
    app[CPU] = CpuPool()
    app[HISTORY] = History(metrics)
    app[SPEC] = SpecTelemetry(settings, metrics, app[POOL], lambda: app[POLICIES].current)
    for backend in app[POOL]:
        metrics.spec_requested.labels(backend.name).set(1 if backend.speculative_requested else 0)
    setup_routes(app)
    setup_frontdoor_routes(app)
    setup_admin_routes(app)
    setup_status_routes(app)
    app.on_shutdown.append(finish_in_flight)
    app.cleanup_ctx.append(cpu_context)
    app.cleanup_ctx.append(client_session)
    app.cleanup_ctx.append(health_monitor)
    app.cleanup_ctx.append(cumulative_scraper)
    app.cleanup_ctx.append(policy_reloads)
    app.cleanup_ctx.append(lanes_context)
    app.cleanup_ctx.append(history_context)
    return app


async def lanes_context(app: web.Application) -> AsyncIterator[None]:
    """speclane's own two MLX lanes (``router.lanes.group``) on the start-up model, started
    before serving; the other servable models load on demand (``router.lanes.models``)."""
    app[SUPERVISORS], app[LAYOUT], app[MODELS] = [], None, None
    settings = app[SETTINGS]
    budget = memory_budget(settings.lanes)  # before the start-up model holds any
    started = await start_lanes(settings, app[POOL], app[METRICS])
    app[SUPERVISORS], app[LAYOUT] = started.supervisors, started.layout
    if started.layout is not None:
        catalog = catalog_for(settings, started.models)
        manager = ModelManager(
            settings,
            app[POOL],
            app[METRICS],
            catalog,
            budget,
            rescan=lambda: catalog_for(settings, started.models),
        )
        await manager.start(started)
        app[MODELS] = manager
        log.info("models: %s servable (%s)", len(catalog.models), ", ".join(catalog.names()))
    yield
    if (models := app[MODELS]) is not None:
        await models.stop()  # the start-up model's lanes too


async def finish_in_flight(app: web.Application) -> None:
    """On shutdown: refuse new requests, give the running ones ``shutdown_grace`` seconds,
    then end streams with an error event (aiohttp alone would cut them silently)."""
    await app[RELAY].shutdown(app[SETTINGS].shutdown_grace)


def initial_policies(settings: Settings) -> PolicySet:
    directory = settings.policies_dir
    if not directory.exists() and "policies_dir" not in settings.model_fields_set:
        warn_no_policies(directory)
        return PolicySet.implied()
    policies = load_policies(directory, presets=settings.presets.keys(), spec=settings.spec)
    if is_packaged(directory):
        log.info(
            "policies: the defaults shipped with speclane (%s); to change them, copy "
            "that directory and set policies_dir (or --policies)",
            directory,
        )
    else:
        log.info("policies: %s", directory.absolute())
    for note in policies.notes:
        log.info("policies: %s", note)
    for warning in policies.warnings:
        log.warning("policies: %s", warning)
    return policies


def warn_no_policies(directory: Path) -> None:
    """Said loudly: every client, whatever it sends, gets the permissive implied default."""
    banner = "!" * 78
    lines = [
        banner,
        f"WARNING: no policies directory found (looked for {directory.absolute()},",
        "  policies/ next to the configuration file, and the defaults shipped with",
        "  speclane): EVERY CLIENT GETS THE PERMISSIVE DEFAULT POLICY (no keys, no limits).",
        "  Set policies_dir in the configuration or pass --policies DIR.",
        banner,
    ]
    print("\n".join(lines), file=sys.stderr, flush=True)
    log.warning("no policies directory: every client gets the permissive default")


async def policy_reloads(app: web.Application) -> AsyncIterator[None]:
    watcher = app[POLICIES]
    if not watcher.directory.is_dir():
        yield
        return
    poller = watcher.poller()
    poller.start()
    watcher.install_sighup()
    yield
    watcher.remove_sighup()
    await poller.stop()


async def client_session(app: web.Application) -> AsyncIterator[None]:
    # No connection limit: admission control and per-client limits decide concurrency,
    # and a pool limit here would queue streams invisibly.
    connector = aiohttp.TCPConnector(limit=0, keepalive_timeout=30, enable_cleanup_closed=True)
    # Ask upstreams for identity encoding: compressing on loopback only costs CPU.
    session = aiohttp.ClientSession(
        connector=connector, skip_auto_headers=("User-Agent", "Accept-Encoding")
    )
    app[SESSION] = session  # health checks and scraping
    bounds = app[SETTINGS].upstream
    client = Http1Pool(
        keepalive=30.0,  # the relay's own: see router.upstream.client for why
        max_body=bounds.max_body_bytes,
        head_timeout=bounds.head_timeout,
        max_trailer=bounds.max_trailer_bytes,
    )
    app[RELAY] = Relay(client, app[POOL], app[SETTINGS].retry, app[METRICS])
    yield
    await app[RELAY].close()
    await client.close()
    await session.close()


async def cumulative_scraper(app: web.Application) -> AsyncIterator[None]:
    scraper = CumulativeScraper(
        app[POOL], app[SESSION], app[SETTINGS].spec.scrape_interval, app[SPEC].observe_cumulative
    )
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
