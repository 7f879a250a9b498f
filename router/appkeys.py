"""Typed application state keys, shared by the app factory and the handlers."""

from __future__ import annotations

from dataclasses import dataclass, field

import aiohttp
from aiohttp import web

from router.backends.pool import BackendPool
from router.config.settings import Settings
from router.config.watch import PolicyWatcher
from router.lanes.supervisor import LaneSupervisor
from router.metrics import Metrics
from router.proxy.admission import ConcurrencyLimiter
from router.proxy.relay import Relay
from router.proxy.telemetry import SpecTelemetry
from router.routing.affinity import AffinityMap
from router.routing.load import LoadGate


@dataclass
class RoutingState:
    """What one decision leaves for the next: the load gate's hysteresis state, and which
    lane last served each conversation prefix (cache-aware routing)."""

    gate: LoadGate = field(default_factory=LoadGate)
    affinity: AffinityMap = field(default_factory=AffinityMap)


SETTINGS = web.AppKey("settings", Settings)
METRICS = web.AppKey("metrics", Metrics)
POOL = web.AppKey("pool", BackendPool)
SESSION = web.AppKey("session", aiohttp.ClientSession)
RELAY = web.AppKey("relay", Relay)
POLICIES = web.AppKey("policies", PolicyWatcher)
LIMITER = web.AppKey("limiter", ConcurrencyLimiter)
ROUTING = web.AppKey("routing", RoutingState)
SUPERVISORS = web.AppKey("supervisors", list[LaneSupervisor])
SPEC = web.AppKey("spec", SpecTelemetry)
