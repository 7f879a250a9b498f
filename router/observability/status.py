"""The status page (``GET /ui``; ``GET /`` for browsers) and its live data
(``GET /admin/status``).

``/`` answers a browser (``Accept`` naming ``text/html``) with the page and anything else
with the plain text ``Ollama is running``: what Ollama answers there, so that Ollama
clients that probe ``/`` before talking to the Ollama API connect.

The page is one static HTML file (package data: inline CSS, JS and SVG; no external assets,
no build step; works offline). It holds no data itself: it polls ``/admin/status``, which
follows the admin rules of ``router.admin`` (loopback-only without ``admin_key``, else the
key as a bearer token, which the page asks for and keeps in the tab's sessionStorage).
"""

from __future__ import annotations

import time
from functools import cache
from importlib import resources
from typing import Any

from aiohttp import web

from router import __version__
from router.admin import lanes_view
from router.metrics import package_version
from router.proxy.admin_auth import require_admin
from router.proxy.services import Services, bind

OLLAMA_BANNER = "Ollama is running"
RECENT_SHOWN = 50


@cache
def page() -> bytes:
    return resources.files("router.observability").joinpath("status.html").read_bytes()


def wants_html(request: web.Request) -> bool:
    return "text/html" in request.headers.get("Accept", "").lower()


async def root(request: web.Request) -> web.Response:
    if wants_html(request):
        return await ui(request)
    return web.Response(text=OLLAMA_BANNER, content_type="text/plain")


async def ui(request: web.Request) -> web.Response:
    # The page itself holds no data: it is served to anyone who can reach the router; the
    # data it polls is admin-only.
    return web.Response(
        body=page(),
        content_type="text/html",
        charset="utf-8",
        headers={
            "Cache-Control": "no-cache",
            "Content-Security-Policy": "default-src 'self'; "
            "style-src 'unsafe-inline'; script-src 'unsafe-inline'; "
            "img-src 'self' data:",
        },
    )


def queues(services: Services) -> list[dict[str, Any]]:
    limiter = services.limiter
    rows = []
    for policy in services.policies.current:
        rows.append(
            {
                "client": policy.client,
                "active": limiter.active(policy.client),
                "queued": limiter.queued(policy.client),
                "limit": policy.max_concurrency,
                "priority": policy.priority,
            }
        )
    known = {r["client"] for r in rows}
    for extra in ("unidentified",):
        if extra not in known and (limiter.active(extra) or limiter.queued(extra)):
            rows.append(
                {
                    "client": extra,
                    "active": limiter.active(extra),
                    "queued": limiter.queued(extra),
                    "limit": None,
                    "priority": None,
                }
            )
    return rows


def snapshot(services: Services) -> dict[str, Any]:
    recent = list(services.access.recent)[-RECENT_SHOWN:]
    return {
        "version": __version__,
        "mlx": package_version("mlx"),
        "mlx_lm": package_version("mlx-lm"),
        "now": time.time(),
        "uptime_s": round(time.monotonic() - services.up_since, 1),
        **lanes_view(services),  # backends, layout, workers and models, as /admin/lanes
        "spec": services.spec.admin_snapshot(),
        "history": services.history.to_json(),
        "recent": [r.to_json() for r in reversed(recent)],
        "queues": queues(services),
    }


async def status(services: Services, request: web.Request) -> web.Response:
    require_admin(services, request)
    return web.json_response(snapshot(services), headers={"Cache-Control": "no-store"})


def setup_status_routes(app: web.Application, services: Services) -> None:
    app.router.add_get("/", root)
    app.router.add_get("/ui", ui)
    app.router.add_get("/admin/status", bind(services, status))
