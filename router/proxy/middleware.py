"""The error middleware: the single place where failures become HTTP responses."""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable

from aiohttp import HttpVersion11, web

from router import errors
from router.errors import RouterError

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]

log = logging.getLogger("speclane.errors")


def to_response(err: RouterError, api: errors.Api = "openai") -> web.Response:
    status, body, headers = errors.render(err, api)
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
    return to_response(RouterError(417, f"unsupported Expect header: {expect[:100]!r}",
                                   code="expectation_failed"))


@web.middleware
async def error_middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
    try:
        return await handler(request)
    except RouterError as e:
        return to_response(e, errors.api_for_path(request.path))
    except web.HTTPRequestEntityTooLarge as e:
        return to_response(RouterError(413, f"request body is larger than the limit: {e.text}",
                                       code="body_too_large"), errors.api_for_path(request.path))
    except web.HTTPException as e:
        if e.status < 400:
            raise
        code = {404: "unknown_endpoint", 405: "method_not_allowed"}.get(e.status, "http_error")
        message = f"{request.method} {request.path}: {e.reason}"
        return to_response(RouterError(e.status, message, code=code),
                           errors.api_for_path(request.path))
    except (ConnectionResetError, TimeoutError) as e:
        # The client vanished while we read its body: nobody is left to answer.
        log.debug("client connection lost: %s", e)
        raise
    except Exception:
        log.exception("internal error on %s %s", request.method, request.path)
        return to_response(errors.internal_error(), errors.api_for_path(request.path))
