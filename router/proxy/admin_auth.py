"""Who may see the admin surface (``/admin/*``, and ``/metrics`` when exposed to admins).

With ``admin_key`` configured, ``Authorization: Bearer <admin_key>`` is required from any
address (401 without, 403 with a wrong key). Without an admin key the admin surface answers
loopback clients only, so a router bound to 0.0.0.0 never exposes it by accident.
"""

from __future__ import annotations

import hmac

from aiohttp import web

from router.appkeys import SETTINGS
from router.config.names import AUTHORIZATION
from router.config.policies import presented_key
from router.errors import RouterError


def is_loopback(request: web.Request) -> bool:
    peer = request.remote or ""
    return peer.startswith("127.") or peer in ("::1", "::ffff:127.0.0.1")


def require_admin(request: web.Request) -> None:
    key = request.app[SETTINGS].admin_key
    if key is None:
        if not is_loopback(request):
            raise RouterError(403, "admin endpoints answer loopback clients only unless "
                              "admin_key is configured", type="permission_error",
                              code="admin_loopback_only")
        return
    # Every Authorization value: two that disagree are a 400, not the first one silently.
    presented = presented_key(request.headers.getall(AUTHORIZATION, []))
    if presented is None:
        raise RouterError(401, "admin endpoints require 'Authorization: Bearer <admin_key>'",
                          type="authentication_error", code="missing_admin_key",
                          headers={"WWW-Authenticate": "Bearer"})
    try:
        token = presented.encode("utf-8")
    except UnicodeEncodeError:  # undecodable header bytes (lone surrogates): nobody's key
        raise RouterError(401, "the admin key is not valid UTF-8", type="authentication_error",
                          code="invalid_admin_key", headers={"WWW-Authenticate": "Bearer"},
                          ) from None
    if not hmac.compare_digest(token, key.get_secret_value().encode()):
        raise RouterError(403, "wrong admin key", type="permission_error",
                          code="invalid_admin_key")
