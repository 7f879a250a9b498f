"""Who may see the admin surface (``/admin/*``, and ``/metrics`` when exposed to admins).

With ``admin_key`` configured, ``Authorization: Bearer <admin_key>`` is required from any
address (401 without, 403 with a wrong key). Without an admin key the admin surface answers
loopback clients only, so a router bound to 0.0.0.0 never exposes it by accident.

The run's local admin token (``router.proxy.localtoken``, what ``speclane policy reload``
sends) is accepted wherever the admin key is. ``require_admin`` says whether the request
proved it holds one of them: a bare loopback request may read and reload, but a policy
change that widens access needs that proof (``router.admin``).
"""

from __future__ import annotations

import hmac

from aiohttp import web

from router.config.names import AUTHORIZATION
from router.kernel.errors import RouterError
from router.proxy.credentials import presented_key
from router.proxy.services import Services


def is_loopback(request: web.Request) -> bool:
    peer = request.remote or ""
    return peer.startswith("127.") or peer in ("::1", "::ffff:127.0.0.1")


def require_admin(services: Services, request: web.Request) -> bool:
    """Raise unless the request may use the admin surface; True when it carried the admin
    key or the local admin token, False for a bare loopback request (no admin key set)."""
    key = services.settings.admin_key
    # Every Authorization value: two that disagree are a 400, not the first one silently.
    presented = presented_key(request.headers.getall(AUTHORIZATION, []))
    token = _encoded(presented)
    if token is not None and _matches(token, services.local_token):
        return True
    if key is None:
        if not is_loopback(request):
            raise RouterError(
                403,
                "admin endpoints answer loopback clients only unless admin_key is configured",
                type="permission_error",
                code="admin_loopback_only",
            )
        return False
    if presented is None:
        raise RouterError(
            401,
            "admin endpoints require 'Authorization: Bearer <admin_key>'",
            type="authentication_error",
            code="missing_admin_key",
            headers={"WWW-Authenticate": "Bearer"},
        )
    if token is None:  # undecodable header bytes (lone surrogates): nobody's key
        raise RouterError(
            401,
            "the admin key is not valid UTF-8",
            type="authentication_error",
            code="invalid_admin_key",
            headers={"WWW-Authenticate": "Bearer"},
        )
    if not _matches(token, key.get_secret_value()):
        raise RouterError(403, "wrong admin key", type="permission_error", code="invalid_admin_key")
    return True


def proves_admin(services: Services, request: web.Request) -> bool:
    """Did the request carry the admin key or the local admin token? Never raises: for
    endpoints that show more to an admin and less to anyone else (``/metrics``)."""
    try:
        presented = presented_key(request.headers.getall(AUTHORIZATION, []))
    except RouterError:  # credentials that disagree prove nothing
        return False
    token = _encoded(presented)
    if token is None:
        return False
    key = services.settings.admin_key
    return _matches(token, services.local_token) or (
        key is not None and _matches(token, key.get_secret_value())
    )


def _encoded(presented: str | None) -> bytes | None:
    if presented is None:
        return None
    try:
        return presented.encode("utf-8")
    except UnicodeEncodeError:
        return None


def _matches(token: bytes, secret: str | None) -> bool:
    return secret is not None and hmac.compare_digest(token, secret.encode())
