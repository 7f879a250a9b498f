"""The router's services: every long-lived object a request meets, built once by
``router.app.wire`` and handed to each handler explicitly (``functools.partial`` at route
registration), never looked up by key per request. A request goes handler
(``router.proxy.handlers.proxy``) -> ``services.relay`` (``router.proxy.relay``) ->
``services.upstream`` (``router.upstream.client``), and mypy checks every hop.

It sits in the edge's folder, above every type it names (the edge's own, the lanes', the
backends'; the Responses door's store and running responses are leaves, the status page's
history a module of its own below the edge) and below every handler that reads it (the
edge's, the front doors', the admin API's, the status page's). The types are imported for
the type checker only, and the floors (``tests/test_layers.py``) count those imports too.
"""

from __future__ import annotations

import functools
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from aiohttp import web
from aiohttp.typedefs import Handler

if TYPE_CHECKING:
    import aiohttp

    from router.backends.pool import BackendPool
    from router.config.settings import Settings
    from router.frontdoors.responses_running import RunningResponses
    from router.frontdoors.responses_store import ResponseStore
    from router.history import History
    from router.lanes.layout import LayoutChoice
    from router.lanes.models import ModelManager
    from router.lanes.supervisor import LaneSupervisor
    from router.metrics import Metrics
    from router.proxy.accesslog import AccessLog
    from router.proxy.admission import ConcurrencyLimiter
    from router.proxy.observe import SpecCounts
    from router.proxy.offload import CpuPool
    from router.proxy.policy_watch import PolicyWatcher
    from router.proxy.relay import Relay
    from router.proxy.speculation import Speculation
    from router.routing.state import RoutingState
    from router.upstream.client import Http1Pool


@dataclass(eq=False)
class Started:
    """What only the app's start-up can make, because making it is async (worker processes,
    an aiohttp session): ``router.app``'s start-up sets each once, before the first request;
    its cleanup ends them."""

    session: aiohttp.ClientSession | None = None  # health checks, scraping, token counts
    supervisors: list[LaneSupervisor] = field(default_factory=list)
    layout: LayoutChoice | None = None  # None: no lanes
    models: ModelManager | None = None  # models on demand; None: no lanes of ours

    def client_session(self) -> aiohttp.ClientSession:
        if self.session is None:
            raise RuntimeError("the app has not started: no client session yet")
        return self.session


@dataclass(frozen=True, slots=True, eq=False)
class Services:
    settings: Settings
    metrics: Metrics
    local_token: str  # this run's local admin token (router.proxy.localtoken)
    pool: BackendPool
    policies: PolicyWatcher
    limiter: ConcurrencyLimiter
    routing: RoutingState
    spec: Speculation  # the router's speculation decision (advise, claim, complete)
    counts: SpecCounts  # the speculative statistics answers and scrapes report, counted
    upstream: Http1Pool  # the relay's HTTP/1.1 client
    relay: Relay
    access: AccessLog
    cpu: CpuPool  # a request's CPU work off the event loop (router.proxy.offload)
    history: History  # the status page's history of the metrics
    responses: ResponseStore  # the Responses API's stored responses
    running: RunningResponses  # the Responses API's responses running now
    up_since: float  # time.monotonic() when the app was built (the status page's uptime)
    up_since_iso: str  # the same moment on the wall clock (Ollama's modified_at)
    started: Started = field(default_factory=Started)


def bind(
    services: Services, handler: Callable[[Services, web.Request], Awaitable[web.StreamResponse]]
) -> Handler:
    """``handler`` as aiohttp calls it (with the request only), the services handed in once."""
    return functools.partial(handler, services)
