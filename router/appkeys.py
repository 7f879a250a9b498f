"""Typed application state keys, shared by the app factory and the handlers."""

from __future__ import annotations

import aiohttp
from aiohttp import web

from router.backends.pool import BackendPool
from router.config import Settings
from router.metrics import Metrics
from router.relay import Relay

SETTINGS = web.AppKey("settings", Settings)
METRICS = web.AppKey("metrics", Metrics)
POOL = web.AppKey("pool", BackendPool)
SESSION = web.AppKey("session", aiohttp.ClientSession)
RELAY = web.AppKey("relay", Relay)
