"""OpenAI answers -> Ollama /api/chat and /api/generate answers (pure; the clock is given).

A stream becomes NDJSON: one line per piece of text (``message.content`` for chat,
``response`` for generate), one line with the tool calls once they are whole (Ollama sends
them whole, with arguments as an object; a call cut by the token limit is dropped), then the
``done`` line with ``done_reason`` and the counts and durations in nanoseconds. Durations are
measured at the router: ``load_duration`` is the time the request waited for its model to
load (0 when it was loaded), the prompt's is the time from then to the first token, the
eval's the rest.
A whole answer cannot be split that way: its time is reported as ``eval_duration``.
A failure ends a stream with a line holding ``error``.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any, Literal

import orjson

from router.frontdoors.common import (
    Pieces,
    arguments_object,
    dict_of,
    first_choices,
    kept_calls,
    logprob_entries,
    translate_events,
    whole_call,
)
from router.kernel import errors
from router.kernel.errors import RouterError
from router.proxy import doorerrors

log = logging.getLogger("speclane.frontdoors")
STREAM_CONTENT_TYPE = "application/x-ndjson"
Kind = Literal["chat", "generate"]


def now_iso() -> str:
    return datetime.now(UTC).isoformat(timespec="microseconds").replace("+00:00", "Z")


def done_reason(finish_reason: Any) -> str:
    return "length" if finish_reason == "length" else "stop"


def _ns(seconds: float) -> int:
    return max(0, int(seconds * 1e9))


def _count(usage: Any, key: str) -> int:
    value = usage.get(key) if isinstance(usage, dict) else None
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else 0


def tool_calls(calls: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """OpenAI tool calls (arguments as JSON text) as Ollama's (arguments as an object)."""
    out = []
    for call in calls:
        name, args = whole_call(call)
        out.append({"function": {"name": name, "arguments": args}})
    return out


class OllamaEgress:
    """One request's translation of the answer (the relay's ``Egress``)."""

    stream_content_type = STREAM_CONTENT_TYPE

    def __init__(
        self,
        kind: Kind,
        model: str,
        arrival: float,
        clock: Callable[[], float] = time.monotonic,
        stamp: Callable[[], str] = now_iso,
        loaded: Callable[[], float] | None = None,
    ) -> None:
        self.kind = kind
        self._loaded = loaded  # the seconds the request waited for its model to load
        self.model = model
        self.arrival = arrival
        self._clock = clock
        self._stamp = stamp
        self._first_token: float | None = None
        self._finish_reason: Any = None
        self._usage: Any = None
        self._logprobs: list[dict[str, Any]] = []  # log-probability entries not sent yet
        self._calls: dict[int, dict[str, Pieces]] = {}  # OpenAI index -> call being assembled
        self._ended = False

    def _line(self, text: str, **extra: Any) -> bytes:
        head: dict[str, Any] = {"model": self.model, "created_at": self._stamp()}
        if self.kind == "chat":
            message: dict[str, Any] = {"role": "assistant", "content": text}
            if "tool_calls" in extra:
                message["tool_calls"] = extra.pop("tool_calls")
            head["message"] = message
        else:
            head["response"] = text
        return orjson.dumps({**head, **extra}) + b"\n"

    def _stats(self, finish_reason: Any, usage: Any, *, whole: bool) -> dict[str, Any]:
        end = self._clock()
        total = end - self.arrival
        load = self._loaded() if self._loaded is not None else 0.0
        if whole or self._first_token is None:
            prompt, decode = 0.0, total - load
        else:
            prompt, decode = self._first_token - self.arrival - load, end - self._first_token
        return {
            "done": True,
            "done_reason": done_reason(finish_reason),
            "total_duration": _ns(total),
            "load_duration": _ns(load),
            "prompt_eval_count": _count(usage, "prompt_tokens"),
            "prompt_eval_duration": _ns(prompt),
            "eval_count": _count(usage, "completion_tokens"),
            "eval_duration": _ns(decode),
        }

    # --- Egress ------------------------------------------------------------------------

    def body(self, answer: Any) -> bytes:
        choices = answer.get("choices") if isinstance(answer, dict) else None
        if not isinstance(choices, list) or not choices or not isinstance(choices[0], dict):
            raise errors.upstream_failed(
                "the backend's answer has no choices", code="upstream_bad_json"
            )
        choice = choices[0]
        extra: dict[str, Any] = {}
        if isinstance(choice.get("message"), dict):
            message = choice["message"]
            text = message.get("content") if isinstance(message.get("content"), str) else ""
            calls = message.get("tool_calls")
            if isinstance(calls, list):
                calls = kept_calls(calls, choice.get("finish_reason"))
            if isinstance(calls, list) and calls:
                extra["tool_calls"] = tool_calls(calls)
        else:
            text = choice.get("text") if isinstance(choice.get("text"), str) else ""
        if entries := logprob_entries(choice):
            extra["logprobs"] = entries
        stats = self._stats(choice.get("finish_reason"), answer.get("usage"), whole=True)
        return self._line(text, **extra, **stats)

    def events(self, data: bytes) -> bytes:
        if self._ended:
            return b""
        return translate_events(
            data, chunk=self._chunk, error=self.error, ended=lambda: self._ended
        )

    def finish(self) -> bytes:
        if self._ended:
            return b""
        out = self._flush_calls()
        self._ended = True
        stats = self._stats(self._finish_reason, self._usage, whole=False)
        return out + self._line("", **self._take_logprobs(), **stats)

    def keep_alive(self, note: str) -> bytes:
        # NDJSON has no comments, and the ollama libraries parse every line (a blank one
        # raises): a chunk without text, as Ollama sends for a step that adds none.
        return self._line("", done=False)

    def error(self, err: RouterError) -> bytes:
        if self._ended:
            return b""
        self._ended = True
        return doorerrors.stream_error(err, "ollama")

    # --- the stream's state --------------------------------------------------------------

    def _chunk(self, event: dict[str, Any]) -> bytes:
        if isinstance(event.get("usage"), dict):
            self._usage = event["usage"]
        out = bytearray()
        for choice in first_choices(event):
            delta = choice.get("delta")
            if isinstance(delta, dict):
                text = delta.get("content")
                calls = delta.get("tool_calls")
                if isinstance(calls, list):
                    self._gather(calls)
            else:
                text = choice.get("text")  # a text completion (raw generate)
            self._logprobs += logprob_entries(choice)
            if isinstance(text, str) and text:
                if self._first_token is None:
                    self._first_token = self._clock()
                out += self._line(text, done=False, **self._take_logprobs())
            if choice.get("finish_reason") is not None:
                self._finish_reason = choice["finish_reason"]
                out += self._flush_calls()
        return bytes(out)

    def _take_logprobs(self) -> dict[str, Any]:
        """The entries not sent yet, for the next line (those that came without text go with
        the last one)."""
        if not self._logprobs:
            return {}
        entries, self._logprobs = self._logprobs, []
        return {"logprobs": entries}

    def _gather(self, calls: list[Any]) -> None:
        if self._first_token is None:
            self._first_token = self._clock()
        for call in calls:
            if not isinstance(call, dict):
                continue
            index = call.get("index", 0)
            slot = self._calls.setdefault(
                index if isinstance(index, int) else 0,
                {"name": Pieces(), "arguments": Pieces()},
            )
            function = dict_of(call, "function")
            if isinstance(function.get("name"), str):
                slot["name"].add(function["name"])
            if isinstance(function.get("arguments"), str):
                slot["arguments"].add(function["arguments"])

    def _flush_calls(self) -> bytes:
        if not self._calls:
            return b""
        gathered = [
            {"function": {key: pieces.text() for key, pieces in self._calls[i].items()}}
            for i in sorted(self._calls)
        ]
        self._calls = {}
        if self._finish_reason == "length":
            # A call cut by the token limit (OpenAI-style backends stream it as far as it got)
            # is unusable, and Ollama sends only whole calls: the done line says "length".
            whole = [
                c for c in gathered if arguments_object(c["function"]["arguments"]) is not None
            ]
            if len(whole) < len(gathered):
                log.info(
                    "dropped %d tool call(s) cut by the token limit", len(gathered) - len(whole)
                )
            if not whole:
                return b""
            gathered = whole
        try:
            calls = tool_calls(gathered)
        except RouterError as err:
            return self.error(err)
        return self._line("", tool_calls=calls, done=False)
