"""The rules of OpenAI request fields that both programs check, the router
(``router.proxy.request``) and the lane worker (``router.worker.request.protocol``): a field's JSON
type and its range, each fault worded once.

``bool`` is an ``int`` subclass in Python, but ``true`` is not a number in JSON: it is
refused wherever a number is expected.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, overload

import orjson

from router.errors import RouterError, bad_request

Kind = type | tuple[type, ...]

_JSON_TYPES: dict[Kind, str] = {
    str: "string",
    int: "integer",
    float: "number",
    (int, float): "number",
    bool: "boolean",
    Mapping: "object",
    dict: "object",
    list: "array",
}


def typed(data: Mapping[str, Any], key: str, kind: Kind, default: Any, *, where: str = "") -> Any:
    """``data[key]`` when it is of ``kind``, ``default`` when absent or null, else a 400.
    ``where``: the path of ``data`` in the request (``"options."``), for the message."""
    value = data.get(key)
    if value is None:
        return default
    if not isinstance(value, kind) or (kind is not bool and isinstance(value, bool)):
        raise wrong_type(where + key, kind)
    return value


def wrong_type(param: str, kind: Kind) -> RouterError:
    return bad_request(f"'{param}' must be of type {_JSON_TYPES.get(kind, 'value')}", param=param)


@overload
def number(
    data: Mapping[str, Any], key: str, default: float, lo: float, hi: float | None
) -> float: ...
@overload
def number(
    data: Mapping[str, Any], key: str, default: None, lo: float, hi: float | None
) -> float | None: ...
def number(
    data: Mapping[str, Any], key: str, default: float | None, lo: float, hi: float | None
) -> float | None:
    """A number in ``[lo, hi]`` (no upper bound when ``hi`` is None), as a float."""
    value = typed(data, key, (int, float), default)
    if value is None:
        return None
    if value < lo or (hi is not None and value > hi):
        raise out_of_range(key, lo, hi)
    return float(value)


@overload
def integer(data: Mapping[str, Any], key: str, default: int, lo: int, hi: int | None) -> int: ...
@overload
def integer(
    data: Mapping[str, Any], key: str, default: None, lo: int, hi: int | None
) -> int | None: ...
def integer(
    data: Mapping[str, Any], key: str, default: int | None, lo: int, hi: int | None
) -> int | None:
    """An integer in ``[lo, hi]`` (no upper bound when ``hi`` is None)."""
    value = typed(data, key, int, default)
    if value is not None and (value < lo or (hi is not None and value > hi)):
        raise out_of_range(key, lo, hi)
    return value


def out_of_range(key: str, lo: float, hi: float | None) -> RouterError:
    bounds = f"at least {_text(lo)}" if hi is None else f"between {_text(lo)} and {_text(hi)}"
    return bad_request(f"'{key}' must be {bounds}", param=key)


def _text(bound: float) -> str:
    return str(bound) if isinstance(bound, int) else f"{bound:g}"


MAX_N = 128  # choices per request (``n``), the router's bound and the lanes'

# --- log-probabilities ----------------------------------------------------------------------

MAX_TOP_LOGPROBS = 20  # chat's ``top_logprobs``, OpenAI's range 0..20
MAX_COMPLETION_LOGPROBS = 5  # legacy completions' ``logprobs``, OpenAI's range 0..5


def logprobs(data: Mapping[str, Any], chat: bool) -> int | None:
    """How many alternatives each token's log-probability comes with, or None (not asked).
    Chat: ``logprobs: true`` and ``top_logprobs`` 0..20 (which needs ``logprobs``);
    completions: ``logprobs`` 0..5."""
    if not chat:
        return integer(data, "logprobs", None, 0, MAX_COMPLETION_LOGPROBS)
    asked = typed(data, "logprobs", bool, False)
    top = integer(data, "top_logprobs", None, 0, MAX_TOP_LOGPROBS)
    if top is not None and not asked:
        raise bad_request("'top_logprobs' needs 'logprobs' to be true", param="top_logprobs")
    return (top or 0) if asked else None


# --- nesting ------------------------------------------------------------------------------

# The one depth rule of request JSON, every door and endpoint: a body (and anything parsed
# from one, such as a tool call's arguments) nests at most this many arrays and objects.
# Real schemas and tool arguments stay far below it. What decides it: orjson reads 1,024
# levels but writes only ORJSON_MAX_DEPTH, and speclane re-encodes every body it forwards
# after its front door wraps it in a few more levels (a schema becomes
# ``response_format.json_schema.schema``): so a body at the limit always encodes.
MAX_JSON_DEPTH = 128
ORJSON_MAX_DEPTH = 254  # orjson's own recursion limit when it encodes (tests pin it)
_PADDING = ORJSON_MAX_DEPTH - MAX_JSON_DEPTH


def too_deep(value: Any) -> bool:
    """Whether ``value`` (parsed JSON) nests more than ``MAX_JSON_DEPTH`` arrays and objects.

    orjson does the walk, in C (a Python walk costs several times the parse of a body made of
    millions of tiny containers): ``value`` under ``ORJSON_MAX_DEPTH - MAX_JSON_DEPTH`` more
    levels encodes exactly when it is at most ``MAX_JSON_DEPTH`` deep (what orjson parsed
    always encodes otherwise: nothing but the depth can fail).
    """
    if not isinstance(value, dict | list):
        return False
    wrapped: Any = value
    for _ in range(_PADDING):
        wrapped = [wrapped]
    try:
        orjson.dumps(wrapped)
    except orjson.JSONEncodeError:
        return True
    return False


def nesting_error(what: str = "request body") -> RouterError:
    return bad_request(
        f"the {what} nests arrays and objects more than {MAX_JSON_DEPTH} levels deep",
        code="body_too_deep",
    )
