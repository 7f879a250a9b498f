"""Ollama /api/chat and /api/generate requests -> the OpenAI request the router forwards (pure).

``options`` map onto OpenAI's sampling fields (``num_predict`` is ``max_tokens``, ``stop``,
``seed``, ``temperature``, ``top_p``, ``top_k``, ``min_p``, ``repeat_penalty``, the two
penalties); ``num_ctx`` and every other option are accepted and ignored, as Ollama ignores
options a model does not use. ``format`` (``"json"`` or a JSON schema) becomes
``response_format``, for backends with constrained decoding. ``keep_alive`` (seconds, or a
duration such as ``"5m"``, ``"1h30m"``; 0 unloads the model after the answer, a negative
value keeps it loaded) sets how long a model of speclane's lanes stays loaded once idle
(``router.lanes.models``); ``think`` is accepted and ignored. Ollama's tool calls carry no ids; the
translation gives them ids and pairs each ``tool`` message with its call.
"""

from __future__ import annotations

import re
from collections import deque
from dataclasses import dataclass
from typing import Any

import orjson

from router.frontdoors.common import str_field
from router.kernel.errors import bad_request
from router.kernel.request_rules import typed
from router.routing.types import Endpoint

_OPTION_MAP = {
    "temperature": "temperature",
    "top_p": "top_p",
    "top_k": "top_k",
    "min_p": "min_p",
    "seed": "seed",
    "repeat_penalty": "repetition_penalty",
    "presence_penalty": "presence_penalty",
    "frequency_penalty": "frequency_penalty",
}
_INT_OPTIONS = frozenset({"top_k", "seed"})


@dataclass(frozen=True, slots=True)
class OllamaRequest:
    endpoint: Endpoint
    openai: dict[str, Any]
    model: str
    stream: bool
    keep_alive: float | None = None  # seconds (< 0: forever); None: not sent


def chat_to_openai(body: dict[str, Any]) -> OllamaRequest:
    model = _model(body)
    raw = body.get("messages")
    if not isinstance(raw, list) or not raw:
        raise bad_request("'messages' is required and must be a non-empty array", param="messages")
    out: dict[str, Any] = {"model": model, "messages": _messages(raw)}
    tools = body.get("tools")
    if tools is not None:
        if not isinstance(tools, list) or not all(isinstance(t, dict) for t in tools):
            raise bad_request("'tools' must be an array of objects", param="tools")
        if tools:
            out["tools"] = [{"type": "function", **t} if "type" not in t else t for t in tools]
    return _common(body, out, "chat")


def generate_to_openai(body: dict[str, Any]) -> OllamaRequest:
    """``raw`` prompts go to the completions endpoint as they are; others become a chat."""
    model = _model(body)
    prompt = str_field(body, "prompt") or ""
    for unsupported in ("suffix", "template"):
        if body.get(unsupported):
            raise bad_request(f"'{unsupported}' is not supported by speclane", param=unsupported)
    images = _images(body.get("images"), "images")
    if body.get("raw") is True:
        if images:
            raise bad_request("'images' cannot be sent with a raw prompt", param="images")
        return _common(body, {"model": model, "prompt": prompt}, "completions")
    messages: list[dict[str, Any]] = []
    system = str_field(body, "system")
    if system:
        messages.append({"role": "system", "content": system})
    messages.append({"role": "user", "content": _content(prompt, images)})
    return _common(body, {"model": model, "messages": messages}, "chat")


def is_load_request(body: dict[str, Any]) -> bool:
    """A generate request without a prompt: Ollama's way to load a model (answered at once)."""
    return not body.get("prompt") and not body.get("images")


def _model(body: dict[str, Any]) -> str:
    model = str_field(body, "model", required=True)
    assert model is not None
    return model


def _common(body: dict[str, Any], out: dict[str, Any], endpoint: Endpoint) -> OllamaRequest:
    stream = body.get("stream", True)
    if stream is None:
        stream = True
    if not isinstance(stream, bool):
        raise bad_request("'stream' must be a boolean", param="stream")
    out.update(_options(body.get("options")))
    out.update(_logprobs(body, endpoint))
    response_format = _format(body.get("format"))
    if response_format is not None:
        out["response_format"] = response_format
    if stream:
        # Ollama reports counts in its last line: ask the backend for usage.
        out["stream"] = True
        out["stream_options"] = {"include_usage": True}
    keep_alive = keep_alive_seconds(body.get("keep_alive"))
    return OllamaRequest(endpoint, out, out["model"], stream, keep_alive)


MAX_TOP_LOGPROBS = 20  # Ollama's and OpenAI chat's
MAX_COMPLETION_LOGPROBS = 5  # OpenAI completions' (a raw generate)


def _logprobs(body: dict[str, Any], endpoint: Endpoint) -> dict[str, Any]:
    """Ollama's ``logprobs: true`` and ``top_logprobs`` (0..20) as OpenAI's: chat's
    ``logprobs`` and ``top_logprobs``, or a raw generate's completions ``logprobs`` (its
    alternatives capped at 5, that endpoint's limit)."""
    asked = body.get("logprobs")
    top = body.get("top_logprobs")
    if asked is not None and not isinstance(asked, bool):
        raise bad_request("'logprobs' must be a boolean", param="logprobs")
    if top is not None and (
        not isinstance(top, int) or isinstance(top, bool) or not 0 <= top <= MAX_TOP_LOGPROBS
    ):
        raise bad_request(
            f"'top_logprobs' must be an integer between 0 and {MAX_TOP_LOGPROBS}",
            param="top_logprobs",
        )
    if not asked:
        return {}
    if endpoint == "completions":
        return {"logprobs": min(top or 0, MAX_COMPLETION_LOGPROBS)}
    return {"logprobs": True, "top_logprobs": top or 0}


# ASCII digits only, as Go's time.ParseDuration: float() and ``\d`` would also take "٣",
# "1_0", "1e3" or "inf" (the one strict way of router.kernel.request_rules.ascii_int, for decimals).
_NUMBER = r"(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+)"
_BARE_NUMBER = re.compile(_NUMBER)
_DURATION_PART = re.compile(rf"({_NUMBER})(ns|us|µs|ms|s|m|h)")
_UNIT_SECONDS = {"ns": 1e-9, "us": 1e-6, "µs": 1e-6, "ms": 1e-3, "s": 1.0, "m": 60.0, "h": 3600.0}
MAX_KEEP_ALIVE = 10 * 365 * 86400.0  # longer is "forever" anyway


def keep_alive_seconds(value: Any) -> float | None:
    """Ollama's ``keep_alive``: a number of seconds or a Go duration string; a negative
    value is -1 (keep loaded); None when absent; 400 when malformed."""
    if value is None:
        return None
    if isinstance(value, bool):
        raise bad_request("'keep_alive' must be a duration or a number", param="keep_alive")
    if isinstance(value, int | float):
        seconds = float(value)
    elif isinstance(value, str) and value.strip():
        text = value.strip()
        sign = -1.0 if text.startswith("-") else 1.0
        body = text.lstrip("+-")
        if _BARE_NUMBER.fullmatch(body):
            seconds = float(body)  # a bare number is seconds
        else:
            parts = _DURATION_PART.findall(body)
            if not parts or "".join(n + u for n, u in parts) != body:
                raise bad_request(
                    f'\'keep_alive\' {value!r} is not a duration (e.g. "5m", "30s", 0)',
                    param="keep_alive",
                )
            seconds = sum(float(n) * _UNIT_SECONDS[u] for n, u in parts)
        seconds *= sign
    else:
        raise bad_request("'keep_alive' must be a duration or a number", param="keep_alive")
    if seconds != seconds:  # NaN
        raise bad_request("'keep_alive' must be a number", param="keep_alive")
    return -1.0 if seconds < 0 else min(seconds, MAX_KEEP_ALIVE)


def _options(options: Any) -> dict[str, Any]:
    if options is None:
        return {}
    if not isinstance(options, dict):
        raise bad_request("'options' must be an object", param="options")
    out: dict[str, Any] = {}
    for name, key in _OPTION_MAP.items():
        kind = int if name in _INT_OPTIONS else (int, float)
        value = typed(options, name, kind, None, where="options.")
        if value is not None:
            out[key] = value
    num_predict = typed(options, "num_predict", int, None, where="options.")
    if num_predict is not None and num_predict > 0:  # -1 (until done), -2 (fill the
        out["max_tokens"] = num_predict  # context): no limit
    stop = options.get("stop")
    if stop is not None:
        stops = [stop] if isinstance(stop, str) else stop
        if not isinstance(stops, list) or not all(isinstance(s, str) and s for s in stops):
            raise bad_request(
                "'options.stop' must be a string or an array of strings", param="options.stop"
            )
        if stops:
            out["stop"] = stops
    typed(options, "num_ctx", int, None, where="options.")
    return out


def _format(value: Any) -> dict[str, Any] | None:
    if value is None or value == "":
        return None
    if value == "json":
        return {"type": "json_object"}
    if isinstance(value, dict):
        return {"type": "json_schema", "json_schema": {"name": "response", "schema": value}}
    raise bad_request("'format' must be \"json\" or a JSON schema object", param="format")


def _messages(raw: list[Any]) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    pending = _Pending()
    calls = 0
    for i, message in enumerate(raw):
        where = f"messages[{i}]"
        if not isinstance(message, dict):
            raise bad_request(f"'{where}' must be an object", param=where)
        role = message.get("role")
        if role not in ("system", "user", "assistant", "tool"):
            raise bad_request(
                f"'{where}.role' must be system, user, assistant or tool", param=where
            )
        content = message.get("content") or ""
        if not isinstance(content, str):
            raise bad_request(f"'{where}.content' must be a string", param=where)
        images = _images(message.get("images"), f"{where}.images")
        if role == "tool":
            answered = pending.answer(message.get("tool_name"))
            out.append(
                {
                    "role": "tool",
                    "content": content,
                    "tool_call_id": answered or f"call_{calls + 1}_unmatched",
                }
            )
            continue
        entry: dict[str, Any] = {"role": role, "content": _content(content, images)}
        tool_calls = message.get("tool_calls")
        if tool_calls:
            if role != "assistant" or not isinstance(tool_calls, list):
                raise bad_request(
                    f"'{where}.tool_calls' must be an array on an assistant message", param=where
                )
            entry["tool_calls"] = []
            for call in tool_calls:
                calls += 1
                entry["tool_calls"].append(_tool_call(call, f"call_{calls}", where))
                pending.add(f"call_{calls}", entry["tool_calls"][-1]["function"]["name"])
        out.append(entry)
    return out


class _Pending:
    """The tool calls not answered yet, oldest first. A tool message answers the oldest
    open call of the tool it names (or the oldest open call when it names none), each in
    constant time: a conversation of many calls left open costs no more than its length
    (a scan of the open calls per tool message was quadratic)."""

    def __init__(self) -> None:
        self._all: deque[tuple[str, str]] = deque()
        self._by_name: dict[str, deque[str]] = {}
        self._answered: set[str] = set()  # answered by name, still in _all

    def add(self, call_id: str, name: str) -> None:
        self._all.append((call_id, name))
        self._by_name.setdefault(name, deque()).append(call_id)

    def answer(self, name: Any) -> str | None:
        if name is None:
            while self._all:
                call_id, call_name = self._all.popleft()
                if call_id in self._answered:
                    self._answered.discard(call_id)
                    continue
                # The oldest open call is also the oldest open call of its own tool.
                self._by_name[call_name].popleft()
                return call_id
            return None
        ids = self._by_name.get(name) if isinstance(name, str) else None
        if not ids:
            return None
        call_id = ids.popleft()
        self._answered.add(call_id)
        return call_id


def _tool_call(call: Any, call_id: str, where: str) -> dict[str, Any]:
    function = call.get("function") if isinstance(call, dict) else None
    if not isinstance(function, dict) or not isinstance(function.get("name"), str):
        raise bad_request(f"'{where}.tool_calls' entries need a function with a name", param=where)
    args = function.get("arguments", {})
    if not isinstance(args, dict):
        raise bad_request(f"'{where}.tool_calls' arguments must be an object", param=where)
    return {
        "id": call_id,
        "type": "function",
        "function": {"name": function["name"], "arguments": orjson.dumps(args).decode()},
    }


def _images(value: Any, where: str) -> list[str]:
    if value is None:
        return []
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise bad_request(f"'{where}' must be an array of base64 strings", param=where)
    return value


def _content(text: str, images: list[str]) -> str | list[dict[str, Any]]:
    if not images:
        return text
    parts: list[dict[str, Any]] = [{"type": "text", "text": text}] if text else []
    for image in images:
        media = "image/jpeg" if image.startswith("/9j/") else "image/png"
        parts.append({"type": "image_url", "image_url": {"url": f"data:{media};base64,{image}"}})
    return parts
