"""The rules of OpenAI request fields that both programs check, the router
(``router.proxy.request``) and the lane worker (``router.worker.protocol``): a field's JSON
type and its range, each fault worded once.

``bool`` is an ``int`` subclass in Python, but ``true`` is not a number in JSON: it is
refused wherever a number is expected.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, overload

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
