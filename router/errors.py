"""Errors carry their whole HTTP answer; this module is the one place that renders them.

This module imports no HTTP framework, so the pure decision modules may raise these
errors too.
Every error body uses the OpenAI shape ``{"error": {"message", "type", "param", "code"}}``
and says through ``type`` (and the ``X-Speclane-Error-Source`` header) whether speclane
itself or the upstream backend failed.
"""

from __future__ import annotations

from typing import Literal

import orjson

Source = Literal["router", "upstream"]


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


def upstream_timeout(message: str) -> RouterError:
    return RouterError(504, message, type="upstream_error", code="upstream_timeout",
                       source="upstream")


def upstream_failed(
    message: str, *, status: int = 502, code: str = "upstream_error"
) -> RouterError:
    return RouterError(status, message, type="upstream_error", code=code, source="upstream")


def render(err: RouterError) -> tuple[int, bytes, dict[str, str]]:
    """Status, JSON body and headers; the HTTP layer wraps them without changing them."""
    headers = {
        "X-Speclane-Error-Source": err.source,
        "Content-Type": "application/json",
        **err.headers,
    }
    return err.status, dump_body(err), headers


def sse_error_event(err: RouterError) -> bytes:
    """The terminating event of a stream that failed after bytes reached the client."""
    return b"data: " + dump_body(err) + b"\n\ndata: [DONE]\n\n"


def dump_body(err: RouterError) -> bytes:
    """The JSON body; never fails. A message may quote request text that is not valid UTF-8
    (aiohttp turns undecodable header bytes into lone surrogates, which orjson refuses):
    those characters are shown escaped instead of turning a 4xx into a crash."""
    body = err.body()
    try:
        return orjson.dumps(body)
    except TypeError:
        inner = {k: v.encode("utf-8", "backslashreplace").decode("utf-8")
                 if isinstance(v, str) else v for k, v in body["error"].items()}  # type: ignore[union-attr]
        return orjson.dumps({"error": inner})


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


def _code(code: object) -> str | int | None:
    """An upstream's error code as it sent it: llama-server's ``"code": 400`` stays a number
    (clients compare it as one); anything else becomes a bounded string."""
    if code is None or (isinstance(code, int) and not isinstance(code, bool)):
        return code
    return str(code)[:200]
