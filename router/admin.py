"""Admin endpoints: lanes and backends, speculative state, policy reload.

Access: with ``admin_key`` configured, ``Authorization: Bearer <admin_key>`` is required
from any address (401 without, 403 with a wrong key). Without an admin key they answer
loopback clients only, so a router bound to 0.0.0.0 never exposes them by accident.
``router.proxy.middleware.browser_guard`` refuses what a web page can send them (a foreign
Host, a cross-site POST) before they run.
"""

from __future__ import annotations

from typing import Any

from aiohttp import web

from router.backends.status import backend_status
from router.kernel.errors import RouterError
from router.lanes.view import every_lane, layout, workers
from router.proxy.admin_auth import require_admin
from router.proxy.middleware import expect_handler
from router.proxy.services import Services, bind
from router.routing.pace import Paces


def lanes_view(services: Services) -> dict[str, Any]:
    """What ``/admin/lanes`` answers; the status page's ``/admin/status`` includes it whole,
    so both always show the same lanes, backends and models."""
    started = services.started
    manager = started.models
    supervisors, states = every_lane(started.supervisors, manager)
    view: dict[str, Any] = {
        "backends": [backend_status(b, states) for b in services.pool],
        "layout": layout(started.layout),
        "workers": workers(supervisors),
        "pace": pace_view(services.routing.paces.snapshot()),
    }
    if manager is not None:  # none without lanes of ours: no models section anywhere
        view["models"] = manager.models()
    return view


def pace_view(paces: Paces) -> dict[str, Any]:
    """The lanes' measured pace that places turns (``router.routing.pace``)."""
    return {
        "lanes": {
            name: {
                "seconds_per_token": {
                    str(rows): round(v, 4) for rows, v in sorted(p.per_token.items())
                },
                "held_first_token_s": _round(p.held_s),
                "moved_first_token_s_per_char": _round(p.moved_s_per_char, 7),
                "cold_first_token_s_per_char": _round(p.cold_s_per_char, 7),
            }
            for name, p in sorted(paces.lanes.items())
        },
        "output_tokens": _round(paces.output_tokens, 1),
    }


def _round(value: float | None, digits: int = 4) -> float | None:
    return None if value is None else round(value, digits)


async def lanes(services: Services, request: web.Request) -> web.Response:
    require_admin(services, request)
    return web.json_response(lanes_view(services))


async def spec(services: Services, request: web.Request) -> web.Response:
    require_admin(services, request)
    return web.json_response(services.spec.admin_snapshot())


async def reload_policies(services: Services, request: web.Request) -> web.Response:
    # A bare loopback request (no admin key set, none presented) may be any web page's
    # doing: it reloads, but a change that widens access waits for the key.
    proven = require_admin(services, request)
    result = await services.policies.reload("admin", widen=proven)
    if result.held:
        raise RouterError(
            403,
            f"{result.error}. This request carried neither the admin key nor the local admin token",
            type="permission_error",
            code="reload_needs_admin_key",
        )
    body = {
        "ok": result.ok,
        "error": result.error,
        "clients": [p.client for p in services.policies.current],
    }
    return web.json_response(body, status=200 if result.ok else 422)


def setup_admin_routes(app: web.Application, services: Services) -> None:
    add_get, add_post = app.router.add_get, app.router.add_post
    add_get("/admin/lanes", bind(services, lanes), expect_handler=expect_handler)
    add_get("/admin/spec", bind(services, spec), expect_handler=expect_handler)
    add_post("/admin/reload", bind(services, reload_policies), expect_handler=expect_handler)
