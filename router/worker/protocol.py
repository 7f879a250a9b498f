"""Request bodies of /v1/chat/completions and /v1/completions, validated into one frozen value.

Unknown fields are ignored (clients send many optional ones), but a field the worker reads is
checked, and a bad one is a 400 in the OpenAI error shape naming the parameter. Defaults follow
mlx_lm.server, the server this worker stands in for: greedy sampling, 512 new tokens.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

from router.errors import bad_request

DEFAULT_MAX_TOKENS = 512
DEFAULT_TEMPERATURE = 0.0
MAX_DRAFT_TOKENS = 16
MAX_STOP_STRINGS = 16

Kind = Literal["chat", "completion"]


@dataclass(frozen=True)
class Message:
    role: str
    content: str


@dataclass(frozen=True)
class GenerationRequest:
    kind: Kind
    model: str | None = None
    messages: tuple[Message, ...] = ()
    prompt: str | tuple[int, ...] = ""
    temperature: float = DEFAULT_TEMPERATURE
    top_p: float = 1.0
    top_k: int = 0
    min_p: float = 0.0
    max_tokens: int = DEFAULT_MAX_TOKENS
    stop: tuple[str, ...] = ()
    seed: int | None = None
    stream: bool = False
    include_usage: bool = False
    num_draft_tokens: int | None = None  # None: the worker's --num-draft-tokens
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    repetition_penalty: float = 1.0
    logit_bias: tuple[tuple[int, float], ...] = ()
    # OpenAI Predicted Outputs: the expected text of the answer. The speculative lane drafts
    # from it; the batching lane ignores it (the answer is the same, only slower to come).
    prediction: str | None = None

    def chat_dicts(self) -> list[dict[str, str]]:
        return [{"role": m.role, "content": m.content} for m in self.messages]


def parse_request(body: Any, kind: Kind) -> GenerationRequest:
    if not isinstance(body, Mapping):
        raise bad_request("the request body must be a JSON object")
    if _get(body, "n", int, 1) != 1:
        raise bad_request("only n=1 is supported", param="n")
    source: dict[str, Any] = (
        {"messages": _messages(body)} if kind == "chat" else {"prompt": _prompt(body)}
    )
    stream_options = _get(body, "stream_options", Mapping, {})
    return GenerationRequest(
        kind=kind,
        model=_get(body, "model", str, None),
        **source,
        temperature=_number(body, "temperature", DEFAULT_TEMPERATURE, 0.0, 2.0),
        top_p=_number(body, "top_p", 1.0, 0.0, 1.0),
        top_k=_integer(body, "top_k", 0, 0, None),
        min_p=_number(body, "min_p", 0.0, 0.0, 1.0),
        max_tokens=_max_tokens(body),
        stop=_stop(body),
        seed=_get(body, "seed", int, None),
        stream=_get(body, "stream", bool, False),
        include_usage=_get(stream_options, "include_usage", bool, False),
        num_draft_tokens=_integer(body, "num_draft_tokens", None, 0, MAX_DRAFT_TOKENS),
        presence_penalty=_number(body, "presence_penalty", 0.0, -2.0, 2.0),
        frequency_penalty=_number(body, "frequency_penalty", 0.0, -2.0, 2.0),
        repetition_penalty=_number(body, "repetition_penalty", 1.0, 0.0, None),
        logit_bias=_logit_bias(body),
        prediction=_prediction(body),
    )


def _get(body: Mapping[str, Any], key: str, kind: type | tuple[type, ...], default: Any) -> Any:
    value = body.get(key)
    if value is None:
        return default
    # bool is an int subclass: true is not a valid max_tokens.
    if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
        name = kind.__name__ if isinstance(kind, type) else "/".join(k.__name__ for k in kind)
        raise bad_request(f"'{key}' must be of type {_json_type(name)}", param=key)
    return value


def _json_type(python_name: str) -> str:
    return {"str": "string", "int": "integer", "bool": "boolean", "Mapping": "object"}.get(
        python_name, python_name
    )


def _number(
    body: Mapping[str, Any], key: str, default: float, lo: float, hi: float | None
) -> float:
    value = _get(body, key, (int, float), default)
    if isinstance(value, bool) or value < lo or (hi is not None and value > hi):
        upper = "" if hi is None else f" and <= {hi}"
        raise bad_request(f"'{key}' must be a number >= {lo}{upper}", param=key)
    return float(value)


def _integer(
    body: Mapping[str, Any], key: str, default: int | None, lo: int, hi: int | None
) -> int | None:
    value = _get(body, key, int, default)
    if value is not None and (value < lo or (hi is not None and value > hi)):
        upper = "" if hi is None else f" and <= {hi}"
        raise bad_request(f"'{key}' must be an integer >= {lo}{upper}", param=key)
    return value


def _max_tokens(body: Mapping[str, Any]) -> int:
    key = "max_completion_tokens" if body.get("max_completion_tokens") is not None else "max_tokens"
    value = _integer(body, key, DEFAULT_MAX_TOKENS, 1, None)
    assert value is not None
    return value


def _stop(body: Mapping[str, Any]) -> tuple[str, ...]:
    value = body.get("stop")
    if value is None:
        return ()
    items = [value] if isinstance(value, str) else value
    if (
        not isinstance(items, list)
        or len(items) > MAX_STOP_STRINGS
        or not all(isinstance(s, str) and s for s in items)
    ):
        raise bad_request(
            f"'stop' must be a non-empty string or a list of up to {MAX_STOP_STRINGS} of them",
            param="stop",
        )
    return tuple(items)


def _messages(body: Mapping[str, Any]) -> tuple[Message, ...]:
    raw = body.get("messages")
    if not isinstance(raw, list) or not raw:
        raise bad_request("'messages' must be a non-empty array", param="messages")
    messages = []
    for i, item in enumerate(raw):
        if not isinstance(item, Mapping) or not isinstance(item.get("role"), str):
            raise bad_request(f"messages[{i}] must be an object with a 'role'", param="messages")
        messages.append(Message(item["role"], _content(item.get("content"), i)))
    return tuple(messages)


def _content(content: Any, index: int) -> str:
    if content is None or isinstance(content, str):
        return content or ""
    if isinstance(content, list):
        parts = []
        for part in content:
            if not isinstance(part, Mapping) or part.get("type") != "text":
                raise bad_request(
                    f"messages[{index}].content: only text parts are supported",
                    param="messages",
                )
            parts.append(str(part.get("text", "")))
        return "".join(parts)
    raise bad_request(f"messages[{index}].content must be a string or an array", param="messages")


def _prompt(body: Mapping[str, Any]) -> str | tuple[int, ...]:
    value = body.get("prompt")
    if isinstance(value, list) and len(value) == 1 and isinstance(value[0], str | list):
        value = value[0]  # a batch of one prompt
    if isinstance(value, str) and value:
        return value
    if isinstance(value, list) and value and all(_is_token(t) for t in value):
        return tuple(value)
    raise bad_request(
        "'prompt' must be a non-empty string or array of token ids (one prompt)", param="prompt"
    )


def _is_token(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def _logit_bias(body: Mapping[str, Any]) -> tuple[tuple[int, float], ...]:
    raw = _get(body, "logit_bias", Mapping, {})
    out = []
    for key, bias in raw.items():
        ok = str(key).isdigit() and isinstance(bias, int | float) and not isinstance(bias, bool)
        if not ok or not -100 <= bias <= 100:
            raise bad_request(
                "'logit_bias' maps token ids to numbers in [-100, 100]", param="logit_bias"
            )
        out.append((int(key), float(bias)))
    return tuple(out)


def _prediction(body: Mapping[str, Any]) -> str | None:
    """``{"type": "content", "content": str | [{"type": "text", "text": str}, ...]}``."""
    raw = body.get("prediction")
    if raw is None:
        return None
    message = "'prediction' must be {\"type\": \"content\", \"content\": string or text parts}"
    if not isinstance(raw, Mapping) or raw.get("type") != "content":
        raise bad_request(message, param="prediction")
    content = raw.get("content")
    if isinstance(content, str):
        return content or None
    if isinstance(content, list) and all(
        isinstance(p, Mapping) and p.get("type") == "text" and isinstance(p.get("text"), str)
        for p in content
    ):
        return "".join(p["text"] for p in content) or None
    raise bad_request(message, param="prediction")
