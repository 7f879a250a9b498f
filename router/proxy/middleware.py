"""The middlewares: the single place where failures become HTTP responses, and the
browser guards every request passes before its handler (``browser_guard``)."""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable

from aiohttp import HttpVersion11, hdrs, web
from aiohttp.typedefs import Middleware

from router.kernel import errors
from router.kernel.errors import RouterError
from router.proxy import doorerrors
from router.proxy.hosts import HostRule, is_loopback_name, origin_host, same_origin

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]

log = logging.getLogger("speclane.errors")


def to_response(err: RouterError, api: doorerrors.Api = "openai") -> web.Response:
    status, body, headers = doorerrors.render(err, api)
    return web.Response(status=status, body=body, headers=headers)


async def expect_handler(request: web.Request) -> web.StreamResponse | None:
    """aiohttp's ``Expect`` handling (it runs before the middleware), with an unknown
    expectation answered in the OpenAI error shape instead of a plain-text 417."""
    expect = request.headers.get("Expect", "")
    if request.version != HttpVersion11:
        return None
    if expect.lower() == "100-continue":
        await request.writer.write(b"HTTP/1.1 100 Continue\r\n\r\n")
        request.writer.output_size = 0  # the answer proper has not started
        return None
    return to_response(
        RouterError(417, f"unsupported Expect header: {expect[:100]!r}", code="expectation_failed")
    )


@web.middleware
async def error_middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
    try:
        return await handler(request)
    except RouterError as e:
        return to_response(e, doorerrors.api_for_path(request.path))
    except web.HTTPRequestEntityTooLarge as e:
        return to_response(
            RouterError(
                413, f"request body is larger than the limit: {e.text}", code="body_too_large"
            ),
            doorerrors.api_for_path(request.path),
        )
    except web.HTTPException as e:
        if e.status < 400:
            raise
        code = {404: "unknown_endpoint", 405: "method_not_allowed"}.get(e.status, "http_error")
        message = f"{request.method} {request.path}: {e.reason}"
        return to_response(
            RouterError(e.status, message, code=code), doorerrors.api_for_path(request.path)
        )
    except (ConnectionResetError, TimeoutError) as e:
        # The client vanished while we read its body: nobody is left to answer.
        log.debug("client connection lost: %s", e)
        raise
    except Exception:
        log.exception("internal error on %s %s", request.method, request.path)
        return to_response(errors.internal_error(), doorerrors.api_for_path(request.path))


# What a cross-site page can make a browser send without a CORS preflight.
FORM_TYPES = ("text/plain", "application/x-www-form-urlencoded", "multipart/form-data")
SAFE_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})


def browser_guard(rule: HostRule) -> Middleware:
    """A middleware that refuses what a hostile web page can make a browser send.

    Every request: a ``Host`` that ``rule`` does not allow is answered 421 (DNS rebinding:
    the browser thinks it talks to the attacker's name). A request that does something (any
    method but GET/HEAD/OPTIONS) is refused 403 when it comes from another site
    (``Sec-Fetch-Site: cross-site`` or ``same-site``; an ``Origin`` other than the request's
    own whose host is not allowed or is a loopback name, i.e. another local program's page;
    ``Origin: null``): a page the user visits must not make their machine generate, fill its
    prompt cache or spend a client's limits. An admin request is refused also when it carries
    a body a form can send (CSRF); API requests may (``curl -d`` sends a form type).
    """

    @web.middleware
    async def guard(request: web.Request, handler: Handler) -> web.StreamResponse:
        for value in request.headers.getall(hdrs.HOST, ()):
            if not rule.allows_header(value):
                raise RouterError(
                    421,
                    f"this server does not answer for the host {value[:100]!r}: add it "
                    "to allowed_hosts if that name is meant to reach speclane",
                    type="permission_error",
                    code="host_not_allowed",
                )
        if request.method not in SAFE_METHODS and (
            hdrs.ORIGIN in request.headers
            or "Sec-Fetch-Site" in request.headers
            or request.path.startswith("/admin/")
        ):
            refuse_cross_site(request, rule)
        return await handler(request)

    return guard


def refuse_cross_site(request: web.Request, rule: HostRule) -> None:
    headers = request.headers
    admin = request.path.startswith("/admin/")
    if not admin and hdrs.ORIGIN not in headers and "Sec-Fetch-Site" not in headers:
        return  # a program's request: the usual case, decided without parsing anything
    site = headers.get("Sec-Fetch-Site", "").strip().lower()
    reason = None
    if site in ("cross-site", "same-site"):
        reason = f"Sec-Fetch-Site: {site}"
    for origin in headers.getall(hdrs.ORIGIN, ()):
        if not same_origin(origin, headers.get(hdrs.HOST, "")):
            host = origin_host(origin)
            # A loopback origin on another port is another local program's page.
            if not rule.allows(host) or host is None or is_loopback_name(host):
                reason = f"Origin: {origin[:100]!r}"
    ctype = headers.get(hdrs.CONTENT_TYPE, "").split(";", 1)[0].strip().lower()
    if admin and ctype in FORM_TYPES:
        reason = f"Content-Type: {ctype} (admin requests take no form body)"
    if reason is None:
        return
    if admin:
        raise RouterError(
            403,
            f"admin requests from web pages are refused ({reason}); use the speclane CLI or curl",
            type="permission_error",
            code="cross_site_admin_request",
        )
    raise RouterError(
        403,
        f"requests from other sites' web pages are refused ({reason}); speclane serves "
        "programs, not pages on other origins",
        type="permission_error",
        code="cross_site_request",
    )
