"""Errors carry their whole HTTP answer; this module is the one place that renders them.

This module imports no HTTP framework, so the pure decision modules may raise these
errors too.
An error is raised once, in speclane's own terms, and rendered in the shape of the API the
client called (``Api``): the OpenAI shape ``{"error": {"message", "type", "param", "code"}}``,
Anthropic's ``{"type": "error", "error": {"type", "message"}}`` with Anthropic's status codes,
or Ollama's ``{"error": "..."}``. Every rendering says through the ``X-Speclane-Error-Source``
header whether speclane itself or the upstream backend failed.
"""

from __future__ import annotations

from typing import Literal

import orjson

from router.kernel import sse
from router.config.names import CLIENT_HEADER, ERROR_SOURCE_HEADER

Source = Literal["router", "upstream"]
# "responses": OpenAI's Responses API, whose errors take the OpenAI shape.
Api = Literal["openai", "anthropic", "ollama", "responses"]
APIS: tuple[Api, ...] = ("openai", "anthropic", "ollama", "responses")


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


def api_for_path(path: str) -> Api:
    """The API a request path belongs to: what shape its errors take, even for an unknown
    endpoint under that API's prefix (a 404 from the router itself)."""
    if path.startswith("/api/"):
        return "ollama"
    if path == "/v1/messages" or path.startswith("/v1/messages/"):
        return "anthropic"
    return "openai"


def render(err: RouterError, api: Api = "openai") -> tuple[int, bytes, dict[str, str]]:
    """Status, JSON body and headers; the HTTP layer wraps them without changing them."""
    headers = {
        ERROR_SOURCE_HEADER: err.source,
        "Content-Type": "application/json",
        **err.headers,
    }
    if api == "anthropic":
        status, kind = anthropic_status(err.status)
        return status, _dumps(anthropic_body(err, kind)), headers
    if api == "ollama":
        return err.status, _dumps(ollama_body(err)), headers
    return err.status, dump_body(err), headers


def unauthorized(message: str, code: str, client: str) -> RouterError:
    """A request the key rule refused, answered under ``client``'s name."""
    return RouterError(
        401, message, code=code, headers={"WWW-Authenticate": "Bearer", CLIENT_HEADER: client}
    )


def sse_error_event(err: RouterError) -> bytes:
    """The terminating event of a stream that failed after bytes reached the client."""
    return sse.frame(dump_body(err)) + sse.DONE_EVENT


def stream_error(err: RouterError, api: Api = "openai") -> bytes:
    """What ends a stream that failed after bytes reached the client, in each API's framing:
    an OpenAI error event then ``[DONE]``; Anthropic's ``event: error``; an Ollama NDJSON
    line holding ``error``."""
    if api == "anthropic":
        body = anthropic_body(err, anthropic_status(err.status)[1])
        return sse.frame(_dumps(body), "error")
    if api == "ollama":
        return _dumps(ollama_body(err)) + b"\n"
    return sse_error_event(err)


# Anthropic's documented error types, by the status it answers them with. Statuses it does
# not use map onto the nearest one: a refused routing (503, nothing can serve) is its
# "overloaded" 529, which its clients retry; an upstream failure (502) is its 500.
_ANTHROPIC_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    413: "request_too_large",
    429: "rate_limit_error",
    500: "api_error",
    504: "timeout_error",
    529: "overloaded_error",
}
_ANTHROPIC_STATUS = {422: 400, 502: 500, 503: 529}


def anthropic_status(status: int) -> tuple[int, str]:
    """(status, Anthropic error type) for one of speclane's statuses."""
    status = _ANTHROPIC_STATUS.get(status, status)
    kind = _ANTHROPIC_TYPES.get(status)
    if kind is None:
        kind = "api_error" if status >= 500 else "invalid_request_error"
    return status, kind


def anthropic_body(err: RouterError, kind: str) -> dict[str, object]:
    return {"type": "error", "error": {"type": kind, "message": _message(err)}}


def ollama_body(err: RouterError) -> dict[str, object]:
    return {"error": _message(err)}


def _message(err: RouterError) -> str:
    # Anthropic and Ollama have no ``code`` or ``param``: the code joins the message so that
    # the reason stays machine-readable (e.g. "[model_not_found] no backend serves ...").
    return f"[{err.code}] {err.message}" if err.code else err.message


def _dumps(body: dict[str, object]) -> bytes:
    try:
        return orjson.dumps(body)
    except TypeError:  # lone surrogates quoted from a request: see dump_body
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
    body = err.body()
    try:
        return orjson.dumps(body)
    except TypeError:
        return orjson.dumps(_escape(body))


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
