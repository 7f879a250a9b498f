"""The error core both programs share: an error carries its whole HTTP answer, rendered here
in the OpenAI shape ``{"error": {"message", "type", "param", "code"}}`` (what the lane worker
answers, and the router's OpenAI door). The other doors' shapes (Anthropic's, Ollama's) are
the router's: ``router.proxy.doorerrors``.

This module imports no HTTP framework, so the pure decision modules may raise these
errors too. Every rendering says through the ``X-Speclane-Error-Source`` header whether
speclane itself or the upstream backend failed.
"""

from __future__ import annotations

from typing import Literal

import orjson

from router.kernel import sse

Source = Literal["router", "upstream"]
# A response header of both programs (documented with the router's in docs/routing.md).
ERROR_SOURCE_HEADER = "X-Speclane-Error-Source"


class LoadError(Exception):
    """A model the lane worker cannot load (a missing config.json, a vocabulary the draft
    does not share, a split the heads do not allow): what it names is the fix."""


class RouterError(Exception):
    """An error that knows the response it should become."""

    def __init__(
        self,
        status: int,
        message: str,
        *,
        type: str = "invalid_request_error",
        code: str | int | None = None,
        param: str | None = None,
        source: Source = "router",
        headers: dict[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.type = type
        self.code = code
        self.param = param
        self.source = source
        self.headers = headers or {}

    def body(self) -> dict[str, object]:
        return {
            "error": {
                "message": self.message,
                "type": self.type,
                "param": self.param,
                "code": self.code,
            }
        }


def bad_request(
    message: str, *, param: str | None = None, code: str = "invalid_request"
) -> RouterError:
    return RouterError(400, message, param=param, code=code)


def not_found(message: str, *, param: str | None = None, code: str = "not_found") -> RouterError:
    return RouterError(404, message, param=param, code=code)


def unavailable(message: str, *, code: str = "no_backend_available") -> RouterError:
    return RouterError(503, message, type="service_unavailable", code=code)


def internal_error(
    where: str = "speclane", reference: str | None = None, *, type: str = "internal_error"
) -> RouterError:
    """A defect in speclane itself: the details go to its log, not to the client (an
    exception's text may hold another request's data). ``reference``: the id its log line
    carries."""
    seen = f"see its log, reference {reference}" if reference else "see its log"
    return RouterError(500, f"internal error in {where} ({seen})", type=type, code="internal_error")


def upstream_timeout(message: str) -> RouterError:
    return RouterError(
        504, message, type="upstream_error", code="upstream_timeout", source="upstream"
    )


def upstream_failed(
    message: str, *, status: int = 502, code: str = "upstream_error"
) -> RouterError:
    return RouterError(status, message, type="upstream_error", code=code, source="upstream")


def render(err: RouterError) -> tuple[int, bytes, dict[str, str]]:
    """Status, JSON body (the OpenAI shape) and headers; the HTTP layer wraps them without
    changing them."""
    return err.status, dump_body(err), error_headers(err)


def error_headers(err: RouterError) -> dict[str, str]:
    return {ERROR_SOURCE_HEADER: err.source, "Content-Type": "application/json", **err.headers}


def sse_error_event(err: RouterError) -> bytes:
    """The terminating event of a stream that failed after bytes reached the client."""
    return sse.frame(dump_body(err)) + sse.DONE_EVENT


def dump_json(body: dict[str, object]) -> bytes:
    """An error body as JSON; never fails (lone surrogates quoted from a request: see
    ``dump_body``)."""
    try:
        return orjson.dumps(body)
    except TypeError:
        return orjson.dumps(_escape(body))


def _escape(value: object) -> object:
    if isinstance(value, str):
        return value.encode("utf-8", "backslashreplace").decode("utf-8")
    if isinstance(value, dict):
        return {k: _escape(v) for k, v in value.items()}
    return value


def dump_body(err: RouterError) -> bytes:
    """The JSON body; never fails. A message may quote request text that is not valid UTF-8
    (aiohttp turns undecodable header bytes into lone surrogates, which orjson refuses):
    those characters are shown escaped instead of turning a 4xx into a crash."""
    return dump_json(err.body())


def from_upstream_body(status: int, body: bytes) -> RouterError:
    """Keep an upstream error's status and message, normalised to the OpenAI shape."""
    message = body.decode("utf-8", "replace").strip() or f"upstream answered {status}"
    err_type, code, param = "upstream_error", None, None
    try:
        parsed = orjson.loads(body)
    except orjson.JSONDecodeError:
        parsed = None
    if isinstance(parsed, dict):
        inner = parsed.get("error", parsed)
        if isinstance(inner, dict):
            message = str(inner.get("message") or inner.get("detail") or message)
            err_type = str(inner.get("type") or err_type)
            code = inner.get("code")
            param = inner.get("param")
        elif isinstance(inner, str):
            message = inner
    return RouterError(
        status,
        message[:4000],
        type=err_type,
        code=_code(code),
        param=None if param is None else str(param)[:4000],
        source="upstream",
    )


def from_upstream_event(event: dict[str, object]) -> RouterError | None:
    """The error an upstream ended its stream with (``{"error": ...}``), else None; its
    status is an HTTP-like integer ``code`` it carries, else 502."""
    inner = event.get("error")
    if inner is None:
        return None
    status = 502
    if isinstance(inner, dict):
        code = inner.get("code")
        if isinstance(code, int) and not isinstance(code, bool) and 400 <= code < 600:
            status = code
    return from_upstream_body(status, orjson.dumps(event))


def _code(code: object) -> str | int | None:
    """An upstream's error code as it sent it: llama-server's ``"code": 400`` stays a number
    (clients compare it as one); anything else becomes a bounded string."""
    if code is None or (isinstance(code, int) and not isinstance(code, bool)):
        return code
    return str(code)[:200]
