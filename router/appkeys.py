"""Typed application state keys, shared by the app factory and the handlers.

The value types are imported for the type checker only: at run time this module imports
nothing of speclane's, so the handlers (``router.proxy``) and the app factory can both use
the keys without an import cycle.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import aiohttp
from aiohttp import web

if TYPE_CHECKING:
    from router.backends.pool import BackendPool
    from router.config.settings import Settings
    from router.lanes.layout import LayoutChoice
    from router.lanes.models import ModelManager
    from router.lanes.supervisor import LaneSupervisor
    from router.metrics import Metrics
    from router.proxy.admission import ConcurrencyLimiter
    from router.proxy.policy_watch import PolicyWatcher
    from router.proxy.relay import Relay
    from router.proxy.telemetry import SpecTelemetry
    from router.routing.state import RoutingState


SETTINGS: web.AppKey[Settings] = web.AppKey("settings")
METRICS: web.AppKey[Metrics] = web.AppKey("metrics")
POOL: web.AppKey[BackendPool] = web.AppKey("pool")
SESSION: web.AppKey[aiohttp.ClientSession] = web.AppKey("session")
RELAY: web.AppKey[Relay] = web.AppKey("relay")
POLICIES: web.AppKey[PolicyWatcher] = web.AppKey("policies")
LIMITER: web.AppKey[ConcurrencyLimiter] = web.AppKey("limiter")
ROUTING: web.AppKey[RoutingState] = web.AppKey("routing")
SUPERVISORS: web.AppKey[list[LaneSupervisor]] = web.AppKey("supervisors")
LAYOUT: web.AppKey[LayoutChoice | None] = web.AppKey("layout")  # None: no lanes
# Models on demand (router.lanes.models); None: no lanes of ours.
MODELS: web.AppKey[ModelManager | None] = web.AppKey("models")
SPEC: web.AppKey[SpecTelemetry] = web.AppKey("spec")
# The local admin token of this run (router.proxy.localtoken): the admin key's authority.
LOCAL_TOKEN: web.AppKey[str] = web.AppKey("local_token")
