"""make_app(): the route table, middlewares, and every resource as a cleanup context."""

from __future__ import annotations

from collections.abc import AsyncIterator

import aiohttp
from aiohttp import web

from router.appkeys import METRICS, POOL, RELAY, SESSION, SETTINGS
from router.backends.base import Backend
from router.backends.health import HealthMonitor
from router.backends.pool import BackendPool
from router.config import Settings
from router.handlers import setup_routes
from router.metrics import Metrics
from router.middleware import error_middleware
from router.relay import Relay


def make_app(settings: Settings, *, metrics: Metrics | None = None) -> web.Application:
    app = web.Application(client_max_size=settings.max_body_bytes, middlewares=[error_middleware])
    app[SETTINGS] = settings
    app[METRICS] = metrics or Metrics()
    app[POOL] = BackendPool([Backend.from_spec(b, settings.cooldown) for b in settings.backends])
    setup_routes(app)
    app.cleanup_ctx.append(client_session)
    app.cleanup_ctx.append(health_monitor)
    return app


async def client_session(app: web.Application) -> AsyncIterator[None]:
    # No connection limit: admission control and per-client limits decide concurrency,
    # and a pool limit here would queue streams invisibly.
    connector = aiohttp.TCPConnector(limit=0, keepalive_timeout=30, enable_cleanup_closed=True)
    # Ask upstreams for identity encoding: compressing on loopback only costs CPU.
    session = aiohttp.ClientSession(connector=connector,
                                    skip_auto_headers=("User-Agent", "Accept-Encoding"))
    app[SESSION] = session
    app[RELAY] = Relay(session, app[POOL], app[SETTINGS].retry, app[METRICS])
    yield
    await app[RELAY].close()
    await session.close()


async def health_monitor(app: web.Application) -> AsyncIterator[None]:
    monitor = HealthMonitor(app[POOL], app[SESSION], app[METRICS], app[SETTINGS].health_interval)
    await monitor.check_all()  # so /v1/models and routing work from the first request
    monitor.start()
    yield
    await monitor.stop()
