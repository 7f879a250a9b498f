"""OpenAI chat answers -> OpenAI Responses answers (pure; the clock is given).

A whole answer becomes one ``response`` object whose ``output`` holds a ``message`` item (the
text) and a ``function_call`` item per tool call. A stream becomes the Responses event
sequence, each event with its ``sequence_number``: ``response.created``,
``response.in_progress``; per text item ``response.output_item.added``,
``response.content_part.added``, ``response.output_text.delta``...,
``response.output_text.done``, ``response.content_part.done``, ``response.output_item.done``;
per function call ``response.output_item.added``, ``response.function_call_arguments.delta``...,
``response.function_call_arguments.done``, ``response.output_item.done``; then
``response.completed`` (or ``response.incomplete`` when the token limit cut the answer). A
failure ends the stream with ``response.failed``; a stream its client cancelled
(``POST /v1/responses/{id}/cancel``) with ``response.cancelled``, its response's status
``cancelled`` and its output what was written before.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable
from typing import Any

import orjson

from router.frontdoors import responses_compact
from router.frontdoors.common import Pieces, first_choices, logprob_entries, translate_events
from router.frontdoors.responses_in import ResponsesRequest
from router.kernel import errors, sse
from router.kernel.errors import RouterError

STREAM_CONTENT_TYPE = "text/event-stream"
# What a finished response leaves for previous_response_id: (the response object, the
# conversation's chat messages including the answer).
Save = Callable[[dict[str, Any], list[dict[str, Any]]], None]


def new_id(prefix: str) -> str:
    return f"{prefix}_{uuid.uuid4().hex}"


def usage(openai_usage: Any) -> dict[str, Any]:
    u = openai_usage if isinstance(openai_usage, dict) else {}
    details = u.get("prompt_tokens_details")
    inp, out = _int(u.get("prompt_tokens")), _int(u.get("completion_tokens"))
    cached = _int(details.get("cached_tokens")) if isinstance(details, dict) else 0
    return {
        "input_tokens": inp,
        "input_tokens_details": {"cached_tokens": cached, "cache_write_tokens": 0},
        "output_tokens": out,
        "output_tokens_details": {"reasoning_tokens": 0},
        "total_tokens": inp + out,
    }


def _int(value: Any) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else 0


def response_object(
    req: ResponsesRequest,
    resp_id: str,
    created_at: int,
    *,
    status: str,
    output: list[dict[str, Any]],
    usage_: dict[str, Any] | None = None,
    error: dict[str, Any] | None = None,
) -> dict[str, Any]:
    incomplete = {"reason": "max_output_tokens"} if status == "incomplete" else None
    return {
        "id": resp_id,
        "object": "response",
        "created_at": created_at,
        "status": status,
        "background": False,
        "error": error,
        "incomplete_details": incomplete,
        "model": req.model,
        "output": output,
        "reasoning": {"effort": None, "summary": None},
        "service_tier": "default",
        "truncation": "disabled",
        "usage": usage_,
        **req.echo,
    }


def message_item(
    item_id: str, text: str, status: str, logprobs: list[Any] | None = None
) -> dict[str, Any]:
    return {
        "id": item_id,
        "type": "message",
        "status": status,
        "role": "assistant",
        "content": [_text_part(text, logprobs)] if status != "in_progress" else [],
    }


def _text_part(text: str, logprobs: list[Any] | None = None) -> dict[str, Any]:
    return {"type": "output_text", "text": text, "annotations": [], "logprobs": logprobs or []}


def call_item(
    item_id: str,
    call_id: str,
    name: str,
    arguments: str,
    status: str,
    namespaces: dict[str, tuple[str, str]],
) -> dict[str, Any]:
    item = {
        "id": item_id,
        "type": "function_call",
        "status": status,
        "call_id": call_id,
        "name": name,
        "arguments": arguments,
    }
    if name in namespaces:
        item["namespace"], item["name"] = namespaces[name]
    return item


def error_object(err: RouterError) -> dict[str, Any]:
    """The ``error`` of a failed response: Responses error codes are few and fixed."""
    code = (
        "rate_limit_exceeded"
        if err.status == 429
        else "server_error"
        if err.status >= 500
        else "invalid_prompt"
    )
    return {"code": code, "message": f"[{err.code}] {err.message}" if err.code else err.message}


def _assistant_message(text: str, calls: list[dict[str, Any]]) -> dict[str, Any]:
    """The answer as the chat message a later turn sends back."""
    message: dict[str, Any] = {"role": "assistant", "content": text or None}
    if calls:
        message["tool_calls"] = [
            {
                "id": c["call_id"],
                "type": "function",
                "function": {"name": c["joined"], "arguments": c["arguments"] or "{}"},
            }
            for c in calls
        ]
    elif message["content"] is None:
        message["content"] = ""
    return message


def compacted_object(
    req: ResponsesRequest, resp_id: str, created_at: int, summary: str, usage_: dict[str, Any]
) -> dict[str, Any]:
    """What ``POST /v1/responses/compact`` answers: the conversation's user messages, then
    one compaction item."""
    users = [
        {
            "type": "message",
            "role": "user",
            "content": [{"type": "input_text", "text": m["content"]}],
        }
        for m in req.conversation
        if m["role"] == "user"
        and isinstance(m["content"], str)
        # an earlier compaction's summary is in the new one: not repeated beside it
        and not m["content"].startswith(responses_compact.PREAMBLE)
    ]
    return {
        "id": resp_id,
        "object": "response.compaction",
        "created_at": created_at,
        "output": [*users, responses_compact.item(summary)],
        "usage": usage_,
    }


def response_body(
    answer: Any, req: ResponsesRequest, resp_id: str, created_at: int
) -> tuple[dict[str, Any], dict[str, Any]]:
    """A whole chat completion as a Response, and the answer as a chat message."""
    choices = answer.get("choices") if isinstance(answer, dict) else None
    if not isinstance(choices, list) or not choices or not isinstance(choices[0], dict):
        raise errors.upstream_failed(
            "the backend's answer has no choices", code="upstream_bad_json"
        )
    choice = choices[0]
    message: dict[str, Any] = choice["message"] if isinstance(choice.get("message"), dict) else {}
    status = "incomplete" if choice.get("finish_reason") == "length" else "completed"
    output: list[dict[str, Any]] = []
    text = message.get("content")
    text = text if isinstance(text, str) else ""
    if req.compaction:  # the summary, as the one item a compaction answers
        output.append(responses_compact.item(text))
        body = response_object(
            req,
            resp_id,
            created_at,
            status=status,
            output=output,
            usage_=usage(answer.get("usage")),
        )
        return body, _assistant_message(text, [])
    if text:
        output.append(message_item(new_id("msg"), text, status, logprob_entries(choice)))
    calls = []
    raw_calls = message.get("tool_calls")
    for call in raw_calls if isinstance(raw_calls, list) else []:
        function = call.get("function") if isinstance(call, dict) else None
        if not isinstance(function, dict) or not isinstance(function.get("name"), str):
            raise errors.upstream_failed(
                "the backend's answer has a malformed tool call", code="upstream_bad_json"
            )
        args = function.get("arguments")
        args = args if isinstance(args, str) else orjson.dumps(args or {}).decode()
        call_id = (
            call.get("id") if isinstance(call.get("id"), str) and call["id"] else new_id("call")
        )
        calls.append({"call_id": call_id, "joined": function["name"], "arguments": args})
        output.append(
            call_item(new_id("fc"), call_id, function["name"], args, "completed", req.namespaces)
        )
    body = response_object(
        req, resp_id, created_at, status=status, output=output, usage_=usage(answer.get("usage"))
    )
    return body, _assistant_message(text, calls)


class ResponsesEgress:
    """One request's translation of the answer (the relay's ``Egress``); a finished
    response is handed to ``save`` (the store) when the request asked to store it."""

    stream_content_type = STREAM_CONTENT_TYPE

    def __init__(
        self,
        req: ResponsesRequest,
        created_at: int,
        save: Save | None = None,
        resp_id: str | None = None,
        compact_endpoint: bool = False,
    ) -> None:
        self.req = req
        self.compact_endpoint = compact_endpoint  # answer POST /v1/responses/compact's shape
        self.created_at = created_at
        self.save = save
        self.id = resp_id or new_id("resp")
        self._seq = 0
        self._started = False
        self._ended = False
        self._output: dict[int, dict[str, Any]] = {}  # finished items by output_index
        self._text_item: dict[str, Any] | None = None  # the open message item
        self._text = Pieces()  # the open message item's text
        self._logprobs: list[Any] = []  # the open message item's log-probability entries
        self._all_text = Pieces()  # all the answer's text (what is stored)
        self._calls: dict[int, dict[str, Any]] = {}  # OpenAI tool call index -> open call
        self._finished_calls: list[dict[str, Any]] = []
        self._next_index = 0
        self._finish_reason: Any = None
        self._usage: Any = None
        self.final: dict[str, Any] | None = None  # the response object as it ended

    # --- Egress ------------------------------------------------------------------------

    def body(self, answer: Any) -> bytes:
        body, message = response_body(answer, self.req, self.id, self.created_at)
        self.final = body
        if self.compact_endpoint:
            summary = message["content"] or ""
            return orjson.dumps(
                compacted_object(self.req, self.id, self.created_at, summary, body["usage"])
            )
        if self.save is not None:
            self.save(body, [*self.req.conversation, message])
        return orjson.dumps(body)

    def events(self, data: bytes) -> bytes:
        if self._ended:
            return b""
        return translate_events(
            data, chunk=self._chunk, error=self.error, ended=lambda: self._ended, head=self._start()
        )

    def finish(self) -> bytes:
        if self._ended:
            return b""
        out = bytearray(self._start())
        incomplete = self._finish_reason == "length"
        if self.req.compaction:
            out += self._compaction_item()
        out += self._close_text("incomplete" if incomplete else "completed")
        for index in sorted(self._calls):
            out += self._close_call(self._calls[index])
        self._calls.clear()
        self._ended = True
        status = "incomplete" if incomplete else "completed"
        body = self.final = self._response(status, usage(self._usage))
        if self.save is not None:
            self.save(
                body,
                [
                    *self.req.conversation,
                    _assistant_message(self._all_text.text(), self._finished_calls),
                ],
            )
        out += self._event(f"response.{status}", {"response": body})
        return bytes(out)

    def error(self, err: RouterError) -> bytes:
        if self._ended:
            return b""
        out = bytearray(self._start())
        self._ended = True
        failed = self.final = self._response("failed", usage(self._usage), error_object(err))
        out += self._event("response.failed", {"response": failed})
        return bytes(out)

    def keep_alive(self, note: str) -> bytes:
        return sse.comment(note)  # no sequence number: not an event

    def cancelled(self) -> bytes:
        """The end of a stream its client cancelled: the text so far closed, a call not
        finished dropped, then ``response.cancelled`` (kept in the store as it is)."""
        if self._ended:
            return b""
        out = bytearray(self._start())
        out += self._close_text("incomplete")
        self._calls.clear()
        self._ended = True
        body = self.final = self._response("cancelled", usage(self._usage))
        if self.save is not None:
            answer = _assistant_message(self._all_text.text(), self._finished_calls)
            self.save(body, [*self.req.conversation, answer])
        out += self._event("response.cancelled", {"response": body})
        return bytes(out)

    def ended_whole(self, status: str, err: RouterError | None = None) -> dict[str, Any]:
        """A whole (background) response that ends without an answer: ``cancelled`` or
        ``failed`` (with ``err``); kept in the store, with the conversation as it was. A
        response that already ended stays as it ended."""
        if self.final is not None:
            return self.final
        body = self.final = self._response(status, None, error_object(err) if err else None)
        if self.save is not None:
            self.save(body, list(self.req.conversation))
        return body

    def shell(self, status: str) -> dict[str, Any]:
        """The response before its answer (``queued``, ``in_progress``)."""
        return self._response(status)

    # --- the stream's state --------------------------------------------------------------

    def _event(self, kind: str, data: dict[str, Any]) -> bytes:
        payload = {"type": kind, "sequence_number": self._seq, **data}
        self._seq += 1
        return b"event: " + kind.encode() + b"\ndata: " + orjson.dumps(payload) + b"\n\n"

    def _response(
        self, status: str, usage_: dict[str, Any] | None = None, error: dict[str, Any] | None = None
    ) -> dict[str, Any]:
        return response_object(
            self.req,
            self.id,
            self.created_at,
            status=status,
            output=[self._output[i] for i in sorted(self._output)],
            usage_=usage_,
            error=error,
        )

    def _start(self) -> bytes:
        if self._started:
            return b""
        self._started = True
        shell = self._response("in_progress")
        return self._event("response.created", {"response": shell}) + self._event(
            "response.in_progress", {"response": shell}
        )

    def _compaction_item(self) -> bytes:
        """The summary written so far as the compaction's one output item."""
        item = responses_compact.item(self._all_text.text())
        index = self._next_index
        self._next_index += 1
        self._output[index] = item
        return self._event(
            "response.output_item.added", {"output_index": index, "item": item}
        ) + self._event("response.output_item.done", {"output_index": index, "item": item})

    def _chunk(self, event: dict[str, Any]) -> bytes:
        out = bytearray()
        if isinstance(event.get("usage"), dict):
            self._usage = event["usage"]
        for choice in first_choices(event):
            delta: dict[str, Any] = choice["delta"] if isinstance(choice.get("delta"), dict) else {}
            text = delta.get("content")
            if self.req.compaction:  # the summary is not streamed: it is the item, at the end
                if isinstance(text, str):
                    self._all_text.add(text)
                if choice.get("finish_reason") is not None:
                    self._finish_reason = choice["finish_reason"]
                continue
            entries = logprob_entries(choice)
            if isinstance(text, str) and text:
                out += self._delta(text, entries)
            elif entries and self._text_item is not None:  # a stream's last entries
                self._logprobs += entries
            calls = delta.get("tool_calls")
            if isinstance(calls, list):
                for call in calls:
                    if isinstance(call, dict):
                        out += self._tool(call)
            if choice.get("finish_reason") is not None:
                self._finish_reason = choice["finish_reason"]
        return bytes(out)

    def _delta(self, text: str, logprobs: list[Any] | None = None) -> bytes:
        out = b""
        item = self._text_item
        if item is None:
            item = self._text_item = message_item(new_id("msg"), "", "in_progress")
            item["output_index"] = self._next_index
            self._next_index += 1
            self._text = Pieces()
            self._logprobs = []
            where = {
                "item_id": item["id"],
                "output_index": item["output_index"],
                "content_index": 0,
            }
            out = self._event(
                "response.output_item.added",
                {"output_index": item["output_index"], "item": _public(item)},
            ) + self._event("response.content_part.added", {**where, "part": _text_part("")})
        self._text.add(text)
        self._all_text.add(text)
        self._logprobs += logprobs or []
        return out + self._event(
            "response.output_text.delta",
            {
                "item_id": item["id"],
                "output_index": item["output_index"],
                "content_index": 0,
                "delta": text,
                "logprobs": logprobs or [],
            },
        )

    def _close_text(self, status: str = "completed") -> bytes:
        item = self._text_item
        if item is None:
            return b""
        self._text_item = None
        where = {"item_id": item["id"], "output_index": item["output_index"], "content_index": 0}
        text, logprobs = self._text.text(), self._logprobs
        done = message_item(item["id"], text, status, logprobs)
        self._output[item["output_index"]] = done
        return (
            self._event("response.output_text.done", {**where, "text": text, "logprobs": logprobs})
            + self._event(
                "response.content_part.done", {**where, "part": _text_part(text, logprobs)}
            )
            + self._event(
                "response.output_item.done", {"output_index": item["output_index"], "item": done}
            )
        )

    def _tool(self, call: dict[str, Any]) -> bytes:
        index = call.get("index", 0)
        if not isinstance(index, int) or isinstance(index, bool):
            index = 0  # hostile or sloppy upstream: an unhashable index must not crash us
        function: dict[str, Any] = (
            call["function"] if isinstance(call.get("function"), dict) else {}
        )
        out = b""
        state = self._calls.get(index)
        if state is None:
            out = self._close_text()  # a text item ends where the calls begin
            call_id = call.get("id")
            name = function.get("name")
            state = self._calls[index] = {
                "id": new_id("fc"),
                "output_index": self._next_index,
                "call_id": call_id if isinstance(call_id, str) and call_id else new_id("call"),
                "joined": name if isinstance(name, str) else "",
                "arguments": Pieces(),
            }
            self._next_index += 1
            item = call_item(
                state["id"],
                state["call_id"],
                state["joined"],
                "",
                "in_progress",
                self.req.namespaces,
            )
            out += self._event(
                "response.output_item.added", {"output_index": state["output_index"], "item": item}
            )
        args = function.get("arguments")
        if isinstance(args, str) and args:
            state["arguments"].add(args)
            out += self._event(
                "response.function_call_arguments.delta",
                {"item_id": state["id"], "output_index": state["output_index"], "delta": args},
            )
        return out

    def _close_call(self, state: dict[str, Any]) -> bytes:
        state["arguments"] = state["arguments"].text()  # whole now: read as a string after
        item = call_item(
            state["id"],
            state["call_id"],
            state["joined"],
            state["arguments"],
            "completed",
            self.req.namespaces,
        )
        self._output[state["output_index"]] = item
        self._finished_calls.append(state)
        return self._event(
            "response.function_call_arguments.done",
            {
                "item_id": state["id"],
                "output_index": state["output_index"],
                "name": item["name"],
                "arguments": state["arguments"],
            },
        ) + self._event(
            "response.output_item.done", {"output_index": state["output_index"], "item": item}
        )


def _public(item: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in item.items() if k != "output_index"}
