"""OpenAI response bodies and stream chunks for chat and text completions (pure)."""

from __future__ import annotations

import hashlib
import time
import uuid
from dataclasses import dataclass, field
from functools import cache

from router import __version__
from router.worker.engines.logprobs import TokenLogprob
from router.worker.request.protocol import Kind


@cache
def system_fingerprint(model: str) -> str:
    """OpenAI's ``system_fingerprint``: the same for every answer of one model under one
    speclane version (what could change an answer for the same request and seed)."""
    digest = hashlib.sha256(f"{model}\0speclane {__version__}".encode()).hexdigest()
    return f"fp_{digest[:10]}"


@dataclass(frozen=True)
class Answer:
    """What stays the same in every chunk of one answer."""

    kind: Kind
    model: str
    id: str = field(default_factory=lambda: uuid.uuid4().hex[:24])
    created: int = field(default_factory=lambda: int(time.time()))

    @property
    def prefix(self) -> str:
        return "chatcmpl-" if self.kind == "chat" else "cmpl-"

    def _head(self, object_: str) -> dict[str, object]:
        return {
            "id": self.prefix + self.id,
            "object": object_,
            "created": self.created,
            "model": self.model,
            "system_fingerprint": system_fingerprint(self.model),
        }

    def choice(
        self,
        index: int,
        text: str | None,
        finish_reason: str,
        tool_calls: list[dict[str, object]] | None = None,
        stop_string: str | None = None,
        logprobs: dict[str, object] | None = None,
    ) -> dict[str, object]:
        """One choice of a whole answer."""
        choice: dict[str, object]
        if self.kind == "chat":
            message: dict[str, object] = {"role": "assistant", "content": text}
            if tool_calls:
                message["tool_calls"] = tool_calls
            choice = {"index": index, "message": message}
        else:
            choice = {"index": index, "text": text or ""}
        choice["logprobs"] = logprobs
        choice["finish_reason"] = finish_reason
        _stop_reason(choice, stop_string)
        return choice

    def body(self, choices: list[dict[str, object]], usage: dict[str, object]) -> dict[str, object]:
        object_ = "chat.completion" if self.kind == "chat" else "text_completion"
        return {**self._head(object_), "choices": choices, "usage": usage}

    def chunk(
        self,
        text: str | None,
        *,
        finish_reason: str | None = None,
        role: bool = False,
        tool_calls: list[dict[str, object]] | None = None,
        logprobs: dict[str, object] | None = None,
        index: int = 0,
    ) -> dict[str, object]:
        if self.kind == "chat":
            delta: dict[str, object] = {"role": "assistant"} if role else {}
            if text is not None or role:  # the role's chunk says null content out loud
                delta["content"] = text
            if tool_calls:
                delta["tool_calls"] = tool_calls
            choice: dict[str, object] = {"index": index, "delta": delta, "logprobs": logprobs}
            object_ = "chat.completion.chunk"
        else:
            choice = {"index": index, "text": text or "", "logprobs": logprobs}
            object_ = "text_completion"
        choice["finish_reason"] = finish_reason
        return {**self._head(object_), "choices": [choice]}

    def final_chunk(
        self,
        finish_reason: str,
        stop_string: str | None = None,
        logprobs: dict[str, object] | None = None,
        index: int = 0,
    ) -> dict[str, object]:
        """The chunk carrying finish_reason."""
        chunk = self.chunk(None, finish_reason=finish_reason, logprobs=logprobs, index=index)
        choices = chunk["choices"]
        if isinstance(choices, list):  # always: chunk() made it
            _stop_reason(choices[0], stop_string)
        return chunk

    def usage_chunk(self, usage: dict[str, object]) -> dict[str, object]:
        """The standard ``stream_options.include_usage`` chunk (then the stream's last)."""
        object_ = "chat.completion.chunk" if self.kind == "chat" else "text_completion"
        return {**self._head(object_), "choices": [], "usage": usage}


def _stop_reason(choice: dict[str, object], stop_string: str | None) -> None:
    """Which stop string ended the answer, in vLLM's ``stop_reason`` field: OpenAI's "stop"
    does not say, and Anthropic's front door answers ``stop_sequence`` with it."""
    if stop_string is not None:
        choice["stop_reason"] = stop_string


class LogprobShapes:
    """One answer's log-probabilities in OpenAI's shapes: chat's ``{"content": [{token,
    logprob, bytes, top_logprobs}], "refusal": null}``, completions' ``{tokens,
    token_logprobs, top_logprobs: [{token: logprob}], text_offset}`` (offsets count from the
    completion's start, across a stream's chunks)."""

    def __init__(self, kind: Kind) -> None:
        self.kind = kind
        self.offset = 0

    def shape(self, entries: tuple[TokenLogprob, ...] | list[TokenLogprob]) -> dict[str, object]:
        if self.kind == "chat":
            content = [
                {
                    **_token(e.token, e.logprob),
                    "top_logprobs": [_token(t, lp) for t, lp in e.top],
                }
                for e in entries
            ]
            return {"content": content, "refusal": None}
        offsets = []
        for e in entries:
            offsets.append(self.offset)
            self.offset += len(e.token)
        return {
            "tokens": [e.token for e in entries],
            "token_logprobs": [e.logprob for e in entries],
            "top_logprobs": [dict(e.top) for e in entries],
            "text_offset": offsets,
        }


def _token(text: str, logprob: float) -> dict[str, object]:
    return {"token": text, "logprob": logprob, "bytes": list(text.encode())}
