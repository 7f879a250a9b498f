"""Each door's error shape: a ``RouterError`` (``router.kernel.errors``) rendered in the shape
of the API the client called (``Api``): the OpenAI shape (the kernel's), Anthropic's
``{"type": "error", "error": {"type", "message"}}`` with Anthropic's status codes, or
Ollama's ``{"error": "..."}``. The error middleware renders every error through ``render``;
a stream that fails after its first byte ends with ``stream_error``.
"""

from __future__ import annotations

from typing import Literal

from router.config.names import CLIENT_HEADER
from router.kernel import sse
from router.kernel.errors import (
    RouterError,
    dump_body,
    dump_json,
    error_headers,
    sse_error_event,
)

# "responses": OpenAI's Responses API, whose errors take the OpenAI shape.
Api = Literal["openai", "anthropic", "ollama", "responses"]


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
    headers = error_headers(err)
    if api == "anthropic":
        status, kind = anthropic_status(err.status)
        return status, dump_json(anthropic_body(err, kind)), headers
    if api == "ollama":
        return err.status, dump_json(ollama_body(err)), headers
    return err.status, dump_body(err), headers


def unauthorized(message: str, code: str, client: str) -> RouterError:
    """A request the key rule refused, answered under ``client``'s name."""
    return RouterError(
        401, message, code=code, headers={"WWW-Authenticate": "Bearer", CLIENT_HEADER: client}
    )


def stream_error(err: RouterError, api: Api = "openai") -> bytes:
    """What ends a stream that failed after bytes reached the client, in each API's framing:
    an OpenAI error event then ``[DONE]``; Anthropic's ``event: error``; an Ollama NDJSON
    line holding ``error``."""
    if api == "anthropic":
        body = anthropic_body(err, anthropic_status(err.status)[1])
        return sse.frame(dump_json(body), "error")
    if api == "ollama":
        return dump_json(ollama_body(err)) + b"\n"
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
