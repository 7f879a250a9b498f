"""OpenAI chat answers -> Anthropic Messages answers (pure).

A whole answer becomes one ``message``; a stream becomes Anthropic's event sequence:
``message_start``, ``ping``, then per content block ``content_block_start``, its
``content_block_delta`` events (``text_delta`` for text, ``input_json_delta`` for a tool
call's arguments) and ``content_block_stop``, then ``message_delta`` (``stop_reason``,
``stop_sequence``, usage) and ``message_stop``. A failure ends it with ``event: error``.

Usage as Anthropic counts it: ``input_tokens`` are the prompt tokens read fresh, without the
``cache_read_input_tokens`` taken from the prompt cache (OpenAI's ``prompt_tokens``
includes them). ``message_start`` goes out with the first chunk of the backend's stream,
which carries the prompt's size when the backend honours ``continuous_usage_stats`` (the
lanes and vLLM do); the final counts come in ``message_delta``, which clients read last.
"""

from __future__ import annotations

import uuid
from typing import Any

import orjson

from router.frontdoors.common import (
    dict_of,
    first_choices,
    kept_calls,
    list_of,
    translate_events,
    whole_call,
)
from router.kernel import errors, sse
from router.kernel.errors import RouterError
from router.kernel.sse import event_json
from router.proxy import doorerrors

STREAM_CONTENT_TYPE = "text/event-stream"


def stop_reason(
    finish_reason: Any, matched: Any, stops: tuple[str, ...], has_tool_calls: bool
) -> tuple[str, str | None]:
    """(Anthropic stop_reason, stop_sequence) from an OpenAI choice.

    OpenAI says "stop" for both the end of the turn and a stop string; which stop string
    matched is read from the choice's ``stop_reason`` (vLLM's convention) when the backend
    reports it.
    """
    if has_tool_calls or finish_reason in ("tool_calls", "function_call"):
        return "tool_use", None
    if finish_reason == "length":
        return "max_tokens", None
    if isinstance(matched, str) and matched in stops:
        return "stop_sequence", matched
    return "end_turn", None


def message_id(upstream_id: Any) -> str:
    if isinstance(upstream_id, str) and upstream_id:
        return "msg_" + upstream_id.removeprefix("chatcmpl-")[:64]
    return "msg_" + uuid.uuid4().hex[:24]


def usage(openai_usage: Any) -> dict[str, int]:
    u = openai_usage if isinstance(openai_usage, dict) else {}
    details = u.get("prompt_tokens_details")
    cached = _int(details.get("cached_tokens")) if isinstance(details, dict) else 0
    prompt = _int(u.get("prompt_tokens"))
    out = {
        "input_tokens": max(0, prompt - cached),
        "output_tokens": _int(u.get("completion_tokens")),
    }
    if cached:
        out["cache_read_input_tokens"] = cached
    return out


def _int(value: Any) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else 0


def context_management(applied: tuple[dict[str, Any], ...] | None) -> dict[str, Any]:
    """The answer's ``context_management`` field, when the request asked for edits."""
    return {} if applied is None else {"context_management": {"applied_edits": list(applied)}}


def message_body(
    answer: Any,
    model: str,
    stops: tuple[str, ...],
    applied: tuple[dict[str, Any], ...] | None = None,
) -> dict[str, Any]:
    """A whole OpenAI chat completion as an Anthropic ``message``."""
    choices = answer.get("choices") if isinstance(answer, dict) else None
    if not isinstance(choices, list) or not choices or not isinstance(choices[0], dict):
        raise errors.upstream_failed(
            "the backend's answer has no choices", code="upstream_bad_json"
        )
    choice = choices[0]
    message = dict_of(choice, "message")
    content: list[dict[str, Any]] = []
    text = message.get("content")
    if isinstance(text, str) and text:
        content.append({"type": "text", "text": text})
    calls = kept_calls(list_of(message, "tool_calls"), choice.get("finish_reason"))
    for call in calls:
        name, args = whole_call(call)
        call_id = call.get("id")
        content.append(
            {
                "type": "tool_use",
                "id": call_id
                if isinstance(call_id, str) and call_id
                else "toolu_" + uuid.uuid4().hex[:24],
                "name": name,
                "input": args,
            }
        )
    reason, sequence = stop_reason(
        choice.get("finish_reason"), choice.get("stop_reason"), stops, bool(calls)
    )
    return {
        "id": message_id(answer.get("id")),
        "type": "message",
        "role": "assistant",
        "model": model,
        "content": content,
        "stop_reason": reason,
        "stop_sequence": sequence,
        "usage": usage(answer.get("usage")),
        **context_management(applied),
    }


def prompt_size(data: bytes) -> int:
    """The prompt's tokens from the first event of the backend's stream, 0 if it has none."""
    for event in sse.json_events(data):
        u = event.get("usage")
        return _int(u.get("prompt_tokens")) if isinstance(u, dict) else 0
    return 0


class AnthropicEgress:
    """One request's translation of the answer (the relay's ``Egress``)."""

    stream_content_type = STREAM_CONTENT_TYPE

    def __init__(
        self,
        model: str,
        stops: tuple[str, ...] = (),
        applied: tuple[dict[str, Any], ...] | None = None,
    ) -> None:
        self.model = model
        self.stops = stops
        self.applied = applied
        self._started = False
        self._ended = False
        self._block = -1  # index of the open content block, -1 when none is open
        self._block_kind = ""  # "text" or "tool_use"
        self._tool_blocks: dict[int, int] = {}  # OpenAI tool call index -> block index
        self._next_block = 0
        self._finish_reason: Any = None
        self._matched: Any = None
        self._usage: Any = None
        self._saw_tool = False

    # --- Egress ------------------------------------------------------------------------

    def body(self, answer: Any) -> bytes:
        return orjson.dumps(message_body(answer, self.model, self.stops, self.applied))

    def events(self, data: bytes) -> bytes:
        if self._ended:
            return b""
        return translate_events(
            data,
            chunk=self._chunk,
            error=self.error,
            ended=lambda: self._ended,
            head=self._start(data),
        )

    def finish(self) -> bytes:
        if self._ended:
            return b""
        out = bytearray(self._start())
        out += self._close_block()
        reason, sequence = stop_reason(
            self._finish_reason, self._matched, self.stops, self._saw_tool
        )
        self._ended = True
        out += event_json(
            "message_delta",
            {
                "type": "message_delta",
                "delta": {"stop_reason": reason, "stop_sequence": sequence},
                "usage": usage(self._usage),
                **context_management(self.applied),
            },
        )
        out += event_json("message_stop", {"type": "message_stop"})
        return bytes(out)

    def error(self, err: RouterError) -> bytes:
        if self._ended:
            return b""
        self._ended = True
        return doorerrors.stream_error(err, "anthropic")

    def keep_alive(self, note: str) -> bytes:
        # Anthropic's own keep-alive; its SDKs skip it, before message_start too.
        return event_json("ping", {"type": "ping"})

    # --- the stream's state --------------------------------------------------------------

    def _start(self, first: bytes = b"") -> bytes:
        if self._started:
            return b""
        self._started = True
        message: dict[str, Any] = {
            "id": message_id(None),
            "type": "message",
            "role": "assistant",
            "model": self.model,
            "content": [],
            "stop_reason": None,
            "stop_sequence": None,
            "usage": {"input_tokens": prompt_size(first), "output_tokens": 0},
        }
        return event_json(
            "message_start", {"type": "message_start", "message": message}
        ) + event_json("ping", {"type": "ping"})

    def _chunk(self, event: dict[str, Any]) -> bytes:
        out = bytearray()
        if isinstance(event.get("usage"), dict):
            self._usage = event["usage"]
        for choice in first_choices(event):
            delta = dict_of(choice, "delta")
            text = delta.get("content")
            if isinstance(text, str) and text:
                out += self._text(text)
            calls = delta.get("tool_calls")
            if isinstance(calls, list):
                for call in calls:
                    if isinstance(call, dict):
                        out += self._tool(call)
            if choice.get("finish_reason") is not None:
                self._finish_reason = choice["finish_reason"]
                self._matched = choice.get("stop_reason")
        return bytes(out)

    def _open(self, kind: str, block: dict[str, Any]) -> bytes:
        out = self._close_block()
        self._block, self._block_kind = self._next_block, kind
        self._next_block += 1
        return out + event_json(
            "content_block_start",
            {"type": "content_block_start", "index": self._block, "content_block": block},
        )

    def _close_block(self) -> bytes:
        if self._block < 0:
            return b""
        index, self._block = self._block, -1
        return event_json("content_block_stop", {"type": "content_block_stop", "index": index})

    def _text(self, text: str) -> bytes:
        out = b""
        if self._block_kind != "text" or self._block < 0:
            out = self._open("text", {"type": "text", "text": ""})
        return out + event_json(
            "content_block_delta",
            {
                "type": "content_block_delta",
                "index": self._block,
                "delta": {"type": "text_delta", "text": text},
            },
        )

    def _tool(self, call: dict[str, Any]) -> bytes:
        index = call.get("index", 0)
        if not isinstance(index, int):
            index = 0  # hostile or sloppy upstream: an unhashable index must not crash us
        function = dict_of(call, "function")
        out = b""
        block = self._tool_blocks.get(index)
        if block is None:
            self._saw_tool = True
            call_id = call.get("id")
            name = function.get("name")
            out = self._open(
                "tool_use",
                {
                    "type": "tool_use",
                    "id": call_id
                    if isinstance(call_id, str) and call_id
                    else "toolu_" + uuid.uuid4().hex[:24],
                    "name": name if isinstance(name, str) else "",
                    "input": {},
                },
            )
            block = self._tool_blocks[index] = self._block
        elif block != self._block:
            return b""  # arguments for a call whose block is closed: Anthropic cannot say it
        args = function.get("arguments")
        if isinstance(args, str) and args:
            out += event_json(
                "content_block_delta",
                {
                    "type": "content_block_delta",
                    "index": block,
                    "delta": {"type": "input_json_delta", "partial_json": args},
                },
            )
        return out


# Anthropic's Models API: a release date is required; speclane's models have none.
MODEL_CREATED_AT = "1970-01-01T00:00:00Z"


def model_list(rows: list[dict[str, Any]], max_tokens_cap: int | None) -> dict[str, Any]:
    """``GET /v1/models`` in Anthropic's shape (its SDKs' ``models.list()``), from the
    OpenAI-shaped rows: ``max_input_tokens`` is the context the lanes report, ``max_tokens``
    the most an answer may be (the client's policy cap, within the context). One page."""
    data = []
    for row in rows:
        model: dict[str, Any] = {
            "type": "model",
            "id": row["id"],
            "display_name": row["id"],
            "created_at": MODEL_CREATED_AT,
            "lifecycle": "active",
        }
        context = row.get("context_length")
        if isinstance(context, int):
            model["max_input_tokens"] = context
            model["max_tokens"] = min(context, max_tokens_cap or context)
        elif max_tokens_cap is not None:
            model["max_tokens"] = max_tokens_cap
        data.append(model)
    return {
        "data": data,
        "has_more": False,
        "first_id": data[0]["id"] if data else None,
        "last_id": data[-1]["id"] if data else None,
    }
