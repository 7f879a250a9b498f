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

from router.kernel.errors import RouterError, bad_request

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


def ascii_int(text: str, lo: int, hi: int, *, param: str) -> int:
    """``text`` (a query parameter, a JSON key) as an integer in ``[lo, hi]``, else a 400
    naming ``param``: ASCII digits only, at most as many as ``hi`` has (so no sign, space,
    ``_``, ``²``, ``①`` or Arabic-Indic digits, and never a 5,000-digit ``int()``)."""
    value = parse_ascii_int(text, lo, hi)
    if value is None:
        raise bad_request(f"'{param}' must be an integer from {lo} to {hi}", param=param)
    return value


def parse_ascii_int(text: str, lo: int, hi: int) -> int | None:
    """``ascii_int`` without the error: None for anything it refuses."""
    if not 0 <= lo <= hi:
        raise ValueError(f"ascii_int takes a range of non-negative integers, not [{lo}, {hi}]")
    if not (0 < len(text) <= len(str(hi)) and text.isascii() and text.isdigit()):
        return None
    value = int(text)
    return value if lo <= value <= hi else None


def out_of_range(key: str, lo: float, hi: float | None) -> RouterError:
    bounds = f"at least {_text(lo)}" if hi is None else f"between {_text(lo)} and {_text(hi)}"
    return bad_request(f"'{key}' must be {bounds}", param=key)


def _text(bound: float) -> str:
    return str(bound) if isinstance(bound, int) else f"{bound:g}"


# --- token ids and seeds -------------------------------------------------------------------

# A token id as ``logit_bias`` spells it (a JSON object key): ASCII digits only, at most ten
# (every vocabulary is far below 10**10). ``str.isdigit`` also takes "²" and "①", which
# ``int`` then refuses, and ``int`` of thousands of digits is slow or refused: neither may
# reach a parse.
MAX_TOKEN_ID_DIGITS = 10
# OpenAI's own bias range; the entry count bounds a request's processor (one gather per
# step): OpenAI documents no count, real uses name a few tokens.
LOGIT_BIAS_RANGE = (-100.0, 100.0)
MAX_LOGIT_BIAS = 1024
# A seed as OpenAI and vLLM take it (a signed 64-bit integer) or MLX does (unsigned 64
# bits): the lanes use it modulo 2**64.
SEED_RANGE = (-(2**63), 2**64 - 1)


def token_id(text: str) -> int | None:
    """``text`` as a token id, or None when it is not one (strictly ASCII digits)."""
    return parse_ascii_int(text, 0, 10**MAX_TOKEN_ID_DIGITS - 1)


def logit_bias(data: Mapping[str, Any], key: str = "logit_bias") -> tuple[tuple[int, float], ...]:
    """``{"<token id>": bias}`` as ``((id, bias), ...)``, or a 400 naming ``key``. Whether an
    id is inside the model's vocabulary only the lane knows (``fit_vocabulary`` there)."""
    raw = typed(data, key, Mapping, {})
    lo, hi = LOGIT_BIAS_RANGE
    if len(raw) > MAX_LOGIT_BIAS:
        raise bad_request(f"'{key}' names at most {MAX_LOGIT_BIAS} tokens", param=key)
    out = []
    for name, bias in raw.items():
        ident = token_id(name) if isinstance(name, str) else None
        number_ok = isinstance(bias, int | float) and not isinstance(bias, bool)
        if ident is None or not number_ok or not lo <= bias <= hi:
            raise bad_request(
                f"'{key}' maps token ids (decimal digits) to numbers in [{lo:g}, {hi:g}]",
                param=key,
            )
        out.append((ident, float(bias)))
    return tuple(out)


def seed(data: Mapping[str, Any], key: str = "seed") -> int | None:
    """A seed in ``SEED_RANGE``, or a 400."""
    return integer(data, key, None, *SEED_RANGE)


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
