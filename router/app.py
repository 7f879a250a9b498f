"""make_app() and wire(): the services built once, the route table (each handler handed the
services), middlewares, and every resource as a cleanup context."""

from __future__ import annotations

import functools
import logging
import sys
import time
from collections.abc import AsyncIterator, Callable
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from datetime import UTC, datetime
from pathlib import Path
from typing import NamedTuple

import aiohttp
from aiohttp import web

from router.admin import setup_admin_routes
from router.backends.base import Backend
from router.backends.health import HealthMonitor
from router.backends.pool import BackendPool
from router.backends.scrape import CumulativeScraper
from router.config.policies import PolicySet, load_policies
from router.config.policydir import is_packaged
from router.config.settings import Settings
from router.frontdoors.handlers import setup_frontdoor_routes
from router.frontdoors.responses_running import RunningResponses
from router.frontdoors.responses_store import ResponseStore
from router.history import History, history_sampling
from router.lanes.group import start_lanes
from router.lanes.models import ModelManager, catalog_for, memory_budget
from router.lanes.process import prompt_cache_dir
from router.metrics import Metrics
from router.observability.status import setup_status_routes
from router.proxy.accesslog import AccessLog
from router.proxy.admission import ConcurrencyLimiter
from router.proxy.handlers import setup_routes
from router.proxy.hosts import HostRule
from router.proxy.localtoken import new_token
from router.proxy.middleware import browser_guard, error_middleware
from router.proxy.observe import SpecCounts
from router.proxy.offload import CpuPool
from router.proxy.partition import keep_key_in
from router.proxy.policy_watch import PolicyWatcher
from router.proxy.relay import Relay
from router.proxy.services import Services
from router.proxy.speculation import Speculation
from router.routing.load import gate_for
from router.routing.state import RoutingState
from router.upstream.client import Http1Pool

log = logging.getLogger("speclane")


class Wired(NamedTuple):
    app: web.Application
    services: Services


def make_app(settings: Settings, *, metrics: Metrics | None = None) -> web.Application:
    """Build the app; raises PolicyError when the policy set is invalid (serve refuses)."""
    return wire(settings, metrics=metrics).app


def wire(settings: Settings, *, metrics: Metrics | None = None) -> Wired:
    """The app and its services: the services are built here, once, and handed to every
    handler and start-up step explicitly (the app holds no state keys of ours)."""
    hosts = HostRule.build(settings.allowed_hosts, settings.host)
    app = web.Application(
        client_max_size=settings.max_body_bytes,
        middlewares=[error_middleware, browser_guard(hosts)],
    )
    services = build_services(settings, metrics or Metrics())
    for backend in services.pool:
        services.metrics.spec_requested.labels(backend.name).set(
            1 if backend.speculative_requested else 0
        )
    setup_routes(app, services)
    setup_frontdoor_routes(app, services)
    setup_admin_routes(app, services)
    setup_status_routes(app, services)

    async def finish_in_flight(_app: web.Application) -> None:
        """On shutdown: refuse new requests, give the running ones ``shutdown_grace``
        seconds, then end streams with an error event (aiohttp alone would cut them
        silently)."""
        await services.relay.shutdown(settings.shutdown_grace)

    async def end_background_responses(_app: web.Application) -> None:
        await services.running.shutdown()

    app.on_shutdown.append(end_background_responses)
    app.on_shutdown.append(finish_in_flight)
    # Each start-up step gets the services it starts, not the app (aiohttp hands it the app).
    for step in (
        cpu_pool,
        client_session,
        health_monitor,
        cumulative_scraper,
        policy_reloads,
        lanes,
        history,
    ):
        app.cleanup_ctx.append(functools.partial(_with_services, step, services))
    return Wired(app, services)


def _with_services(
    step: Callable[[Services], AbstractAsyncContextManager[None]],
    services: Services,
    _app: web.Application,
) -> AbstractAsyncContextManager[None]:
    return step(services)


def build_services(settings: Settings, metrics: Metrics) -> Services:
    pool = BackendPool([Backend.from_spec(b, settings.cooldown) for b in settings.backends])
    policies = PolicyWatcher(
        settings.policies_dir,
        initial_policies(settings),
        presets=settings.presets.keys(),
        spec=settings.spec,
        metrics=metrics,
        interval=settings.policy_poll_interval,
        settle=settings.policy_settle_seconds,
        on_reload=lambda result: spec.policies_reloaded(result.ok),
    )
    spec = Speculation(settings, metrics, pool, lambda: policies.current)
    bounds = settings.upstream
    upstream = Http1Pool(
        keepalive=30.0,  # the relay's own: see router.upstream.client for why
        max_body=bounds.max_body_bytes,
        head_timeout=bounds.head_timeout,
        max_trailer=bounds.max_trailer_bytes,
    )
    responses = settings.responses
    return Services(
        settings=settings,
        metrics=metrics,
        local_token=new_token(),
        pool=pool,
        policies=policies,
        limiter=ConcurrencyLimiter(metrics),
        routing=RoutingState(gate=gate_for(settings.routing)),
        spec=spec,
        counts=SpecCounts(metrics, pool),
        upstream=upstream,
        relay=Relay(
            upstream, pool, settings.retry, metrics, settings.client_limits.stream_keepalive
        ),
        access=AccessLog(),
        cpu=CpuPool(),
        history=History(metrics),
        responses=ResponseStore(responses.store_entries, responses.store_bytes),
        running=RunningResponses(),
        up_since=time.monotonic(),
        up_since_iso=datetime.now(UTC).isoformat(timespec="seconds").replace("+00:00", "Z"),
    )


@asynccontextmanager
async def lanes(services: Services) -> AsyncIterator[None]:
    """speclane's own two MLX lanes (``router.lanes.group``) on the start-up model, started
    before serving; the other servable models load on demand (``router.lanes.models``)."""
    settings, started = services.settings, services.started
    budget = memory_budget(settings.lanes)  # before the start-up model holds any
    if settings.lanes.prompt_cache_disk_bytes != 0 and settings.lanes.prompt_cache_bytes:
        # the lanes' files on disk stay each client's after a restart
        keep_key_in(prompt_cache_dir(settings.lanes))
    made = await start_lanes(settings, services.pool, services.metrics)
    started.supervisors, started.layout = made.supervisors, made.layout
    if made.layout is not None:
        catalog = catalog_for(settings, made.models)
        manager = ModelManager(
            settings,
            services.pool,
            services.metrics,
            catalog,
            budget,
            rescan=lambda: catalog_for(settings, made.models),
        )
        await manager.start(made)
        started.models = manager
        log.info("models: %s servable (%s)", len(catalog.models), ", ".join(catalog.names()))
    yield
    if (models := started.models) is not None:
        await models.stop()  # the start-up model's lanes too


@asynccontextmanager
async def cpu_pool(services: Services) -> AsyncIterator[None]:
    yield
    services.cpu.close()


@asynccontextmanager
async def history(services: Services) -> AsyncIterator[None]:
    async with history_sampling(services.history):
        yield


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


@asynccontextmanager
async def policy_reloads(services: Services) -> AsyncIterator[None]:
    watcher = services.policies
    if not watcher.directory.is_dir():
        yield
        return
    poller = watcher.poller()
    poller.start()
    watcher.install_sighup()
    yield
    watcher.remove_sighup()
    await poller.stop()


@asynccontextmanager
async def client_session(services: Services) -> AsyncIterator[None]:
    # No connection limit: admission control and per-client limits decide concurrency,
    # and a pool limit here would queue streams invisibly.
    connector = aiohttp.TCPConnector(limit=0, keepalive_timeout=30, enable_cleanup_closed=True)
    # Ask upstreams for identity encoding: compressing on loopback only costs CPU.
    session = aiohttp.ClientSession(
        connector=connector, skip_auto_headers=("User-Agent", "Accept-Encoding")
    )
    services.started.session = session  # health checks, scraping and token counts
    yield
    await services.relay.close()
    await services.upstream.close()
    await session.close()


@asynccontextmanager
async def cumulative_scraper(services: Services) -> AsyncIterator[None]:
    scraper = CumulativeScraper(
        services.pool,
        services.started.client_session(),
        services.settings.spec.scrape_interval,
        services.counts.cumulative,
    )
    scraper.start()
    yield
    await scraper.stop()


# How long start-up waits for the first health check of the external backends (they are
# probed together): long enough for any backend that is up, short of a hung one's timeout.
STARTUP_HEALTH_WAIT = 2.0


@asynccontextmanager
async def health_monitor(services: Services) -> AsyncIterator[None]:
    monitor = HealthMonitor(
        services.pool,
        services.started.client_session(),
        services.metrics,
        services.settings.health_interval,
    )
    await monitor.start(wait=STARTUP_HEALTH_WAIT)
    yield
    await monitor.stop()
