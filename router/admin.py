"""Admin endpoints: lanes and backends, speculative state, policy reload.

Access: with ``admin_key`` configured, ``Authorization: Bearer <admin_key>`` is required
from any address (401 without, 403 with a wrong key). Without an admin key they answer
loopback clients only, so a router bound to 0.0.0.0 never exposes them by accident.
"""

from __future__ import annotations

from aiohttp import web

from router.appkeys import POLICIES, POOL, SPEC, SUPERVISORS
from router.backends.status import backend_status
from router.proxy.admin_auth import require_admin
from router.proxy.middleware import expect_handler


async def lanes(request: web.Request) -> web.Response:
    require_admin(request)
    supervised = {s.lane: s.status.state.value for s in request.app[SUPERVISORS]}
    data = [backend_status(b, supervised) for b in request.app[POOL]]
    return web.json_response({"backends": data})


async def spec(request: web.Request) -> web.Response:
    require_admin(request)
    return web.json_response(request.app[SPEC].admin_snapshot())


async def reload_policies(request: web.Request) -> web.Response:
    require_admin(request)
    result = request.app[POLICIES].reload("admin")
    body = {"ok": result.ok, "error": result.error,
            "clients": [p.client for p in request.app[POLICIES].current]}
    return web.json_response(body, status=200 if result.ok else 422)


def setup_admin_routes(app: web.Application) -> None:
    x = {"expect_handler": expect_handler}
    app.router.add_get("/admin/lanes", lanes, **x)
    app.router.add_get("/admin/spec", spec, **x)
    app.router.add_post("/admin/reload", reload_policies, **x)
