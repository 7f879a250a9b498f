"""Tool calling: tools into the prompt, tool calls out of the generated text.

Two syntaxes, chosen once per request by ``syntax_for``:

- **native**: the tokenizer has tool-call markers and a parser (mlx-lm infers them from the
  chat template: ``tokenizer.tool_call_start``, ``tool_call_end``, ``tool_parser``) and its chat
  template renders ``tools`` and assistant ``tool_calls`` itself. Messages and tools go to
  ``apply_chat_template(..., tools=...)`` as mlx_lm.server passes them.
- **fallback** (a template without a tools section, like the default SmolLM2's): the Hermes
  convention. The tools are listed in the system message inside ``<tools></tools>`` and the
  model is told to answer ``<tool_call>\\n{"name": ..., "arguments": {...}}\\n</tool_call>``;
  earlier calls are written back the same way and tool results as
  ``<tool_response>...</tool_response>`` in a user turn. mlx-lm's ``json_tools`` parser (the
  one it uses for Qwen/Hermes templates) reads the calls back. A forced tool call
  (``tool_choice`` required or named) uses this syntax whenever the native parser is not
  ``json_tools``, because the constraint grammar writes this syntax.

Output is split with mlx-lm's ``TextStateMachine`` on the markers (text, not token ids, as
mlx_lm.server does), and each complete call is parsed by the syntax's mlx-lm parser. A call
that does not parse is given back as text content, never dropped.

Streamed answers in the JSON syntax (``json_tools``: a body ``{"name": ..., "arguments":
{...}}``) do not wait for the end of the call: ``ArgumentsScanner`` reads the body as it is
written, and once the name is closed and the arguments object has begun the call's head goes
out, then each new piece of the arguments' raw JSON text, as OpenAI streams them. Any other
shape (keys in another order, a list of calls, a native syntax) is sent whole at its end.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import threading
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from router.worker.decoding.constrain import CALL_END, CALL_START
from router.worker.request.protocol import GenerationRequest, Message, Tool

log = logging.getLogger("speclane.worker")

FALLBACK_INTRO = (
    "# Tools\n\n"
    "You may call one or more functions to assist with the user query.\n\n"
    "You are provided with function signatures within <tools></tools> XML tags:\n<tools>\n"
)
FALLBACK_HOW = (
    "\n</tools>\n\n"
    "For each function call, return a json object with function name and arguments within "
    "<tool_call></tool_call> XML tags:\n"
    '<tool_call>\n{"name": <function-name>, "arguments": <args-json-object>}\n</tool_call>'
)
ARGUMENT_FRAGMENT = 32  # characters of arguments per streamed delta


def _json_tools_parser() -> Callable[[str, Any], Any]:
    from mlx_lm.tool_parsers import json_tools

    return json_tools.parse_tool_call


@dataclass(frozen=True)
class ToolSyntax:
    native: bool
    start: str
    end: str | None
    parser: Callable[[str, Any], Any]


def fallback_syntax() -> ToolSyntax:
    return ToolSyntax(False, CALL_START, CALL_END, _json_tools_parser())


_probe_lock = threading.Lock()
_probed: dict[int, tuple[Any, bool]] = {}
_PROBE = "speclane_probe_function"


def template_renders_tools(tokenizer: Any) -> bool:
    """Whether the chat template shows ``tools`` and assistant ``tool_calls`` (probed once)."""
    with _probe_lock:
        hit = _probed.get(id(tokenizer))
        if hit is not None and hit[0] is tokenizer:
            return hit[1]
    tool = {"type": "function", "function": {"name": _PROBE, "parameters": {"type": "object"}}}
    call = {"id": "c", "type": "function", "function": {"name": _PROBE + "_call", "arguments": {}}}
    try:
        shown = tokenizer.apply_chat_template(
            [{"role": "user", "content": "hi"}],
            tools=[tool],
            tokenize=False,
            add_generation_prompt=True,
        )
        replayed = tokenizer.apply_chat_template(
            [
                {"role": "user", "content": "hi"},
                {"role": "assistant", "content": "", "tool_calls": [call]},
                {"role": "tool", "tool_call_id": "c", "content": "ok"},
            ],
            tools=[tool],
            tokenize=False,
            add_generation_prompt=True,
        )
        native = _PROBE in str(shown) and _PROBE + "_call" in str(replayed)
    except Exception:  # a template that rejects tools or tool roles cannot be native
        native = False
    with _probe_lock:
        _probed[id(tokenizer)] = (tokenizer, native)
    return native


def syntax_for(tokenizer: Any, request: GenerationRequest) -> ToolSyntax:
    if getattr(tokenizer, "has_tool_calling", False) and template_renders_tools(tokenizer):
        parser = tokenizer.tool_parser
        # Whether the constraint grammar writes calls (in the json_tools syntax).
        constrained = request.tool_choice == "required" or (
            request.response_format != "text" and request.calls_tools
        )
        if not constrained or parser is _json_tools_parser():
            return ToolSyntax(True, tokenizer.tool_call_start, tokenizer.tool_call_end, parser)
    return fallback_syntax()


def uses_tools(request: GenerationRequest) -> bool:
    """Whether the prompt involves tools at all (tools offered, or calls/results in history)."""
    return bool(request.tools) or any(m.tool_calls or m.role == "tool" for m in request.messages)


# --- into the prompt -------------------------------------------------------------------------


def chat_inputs(
    request: GenerationRequest, syntax: ToolSyntax
) -> tuple[list[dict[str, Any]], list[dict[str, Any]] | None]:
    """The messages and ``tools`` argument for ``apply_chat_template``."""
    if not uses_tools(request):
        return [{"role": m.role, "content": m.content} for m in request.messages], None
    if syntax.native:
        tools = [t.openai_dict() for t in request.tools] or None
        return [_native_message(m) for m in request.messages], tools
    return fallback_messages(request), None


def _native_message(m: Message) -> dict[str, Any]:
    out: dict[str, Any] = {"role": m.role, "content": m.content}
    if m.tool_calls:
        # mlx_lm.server hands templates the arguments as an object, not JSON text.
        out["tool_calls"] = [
            {
                "id": c.id,
                "type": "function",
                "function": {"name": c.name, "arguments": json.loads(c.arguments)},
            }
            for c in m.tool_calls
        ]
    if m.tool_call_id is not None:
        out["tool_call_id"] = m.tool_call_id
    if m.name is not None:
        out["name"] = m.name
    return out


def fallback_system_text(request: GenerationRequest) -> str:
    lines = [json.dumps(t.openai_dict(), ensure_ascii=False) for t in request.tools]
    text = FALLBACK_INTRO + "\n".join(lines) + FALLBACK_HOW
    if request.forced_tool is not None:
        text += f"\n\nCall the function {request.forced_tool} now."
    elif request.tool_choice == "required":
        text += "\n\nCall at least one function now."
    elif request.tool_choice == "none":
        text += "\n\nDo not call a function now: answer in text."
    if not request.parallel_tool_calls:
        text += "\nCall at most one function."
    return text


def format_call(name: str, arguments: Any) -> str:
    """One call in the fallback syntax (what the model is asked to write)."""
    body = json.dumps({"name": name, "arguments": arguments}, ensure_ascii=False)
    return f"{CALL_START}\n{body}\n{CALL_END}"


def fallback_messages(request: GenerationRequest) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    for m in request.messages:
        if m.role == "tool":
            result = f"<tool_response>\n{m.content}\n</tool_response>"
            # Results of one round share a user turn: templates often require alternation.
            if out and out[-1].get("_results"):
                out[-1]["content"] += "\n" + result
            else:
                out.append({"role": "user", "content": result, "_results": True})
            continue
        content = m.content
        if m.tool_calls:
            calls = [format_call(c.name, json.loads(c.arguments)) for c in m.tool_calls]
            content = "\n".join(([content] if content else []) + calls)
        out.append({"role": m.role, "content": content})
    for message in out:
        message.pop("_results", None)
    if request.tools:
        system = fallback_system_text(request)
        if out and out[0]["role"] in ("system", "developer"):
            out[0]["content"] = f"{out[0]['content']}\n\n{system}" if out[0]["content"] else system
        else:
            out.insert(0, {"role": "system", "content": system})
    return out


# --- out of the answer -----------------------------------------------------------------------


@dataclass(frozen=True)
class ParsedCall:
    index: int
    id: str
    name: str
    arguments: str  # JSON text

    def openai_dict(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "type": "function",
            "function": {"name": self.name, "arguments": self.arguments},
        }

    def stream_deltas(self) -> list[dict[str, Any]]:
        """OpenAI's streaming shape: id, type and name first, then the arguments in pieces."""
        head = {
            "index": self.index,
            "id": self.id,
            "type": "function",
            "function": {"name": self.name, "arguments": ""},
        }
        pieces = [
            self.arguments[i : i + ARGUMENT_FRAGMENT]
            for i in range(0, len(self.arguments), ARGUMENT_FRAGMENT)
        ]
        return [head] + [{"index": self.index, "function": {"arguments": p}} for p in pieces]


@dataclass(frozen=True)
class CallDelta:
    """One streamed piece of a call written as it is generated: its head (``name`` set: the
    id, type and name with empty arguments) or a fragment of its arguments' JSON text."""

    index: int
    id: str | None = None
    name: str | None = None
    arguments: str = ""

    def delta(self) -> dict[str, Any]:
        if self.name is None:
            return {"index": self.index, "function": {"arguments": self.arguments}}
        return {
            "index": self.index,
            "id": self.id,
            "type": "function",
            "function": {"name": self.name, "arguments": self.arguments},
        }


# Text content, one complete call, or a piece of a call being streamed.
Piece = str | ParsedCall | CallDelta

_WS = " \t\n\r"  # JSON's whitespace
_NAME = None  # the head step that is the function name (a JSON string)
# What a call body must begin with to be streamed: `{"name": "<name>", "arguments": {`.
_HEAD_STEPS: tuple[str | None, ...] = ("{", '"name"', ":", _NAME, ",", '"arguments"', ":", "{")
MAX_NAME = 256  # characters of JSON text; a longer name is not streamed (sent whole if valid)


class ArgumentsScanner:
    """Reads a ``json_tools`` call body as it arrives: the head, then the arguments object.

    A tiny JSON scanner, not a parser: it only needs to know where the name ends and where the
    arguments object ends (string and escape state, brace depth), and the whole body is parsed
    at the end of the call anyway. ``state``: ``head`` (matching ``_HEAD_STEPS``), ``arguments``
    (inside the object), ``after`` (the object closed; the rest is the outer object's end) or
    ``off`` (the body is not that shape: the call is sent whole at its end).
    """

    def __init__(self) -> None:
        self.state = "head"
        self.name: str | None = None
        self._step = 0
        self._matched = 0  # characters of the current literal step matched
        self._name_text = ""
        self._depth = 0
        self._in_string = False
        self._escape = False

    def feed(self, text: str) -> tuple[bool, str]:
        """(whether the head was completed by this text, the arguments text it adds)."""
        head_done = False
        begin = end = 0  # text[begin:end] is arguments text
        for i, ch in enumerate(text):
            if self.state == "head":
                if self._head(ch):
                    head_done = True
                    begin, end = i, i + 1
            elif self.state == "arguments":
                self._arguments(ch)
                end = i + 1
            else:  # "after" or "off": nothing more to find
                break
        return head_done, text[begin:end]

    def _off(self) -> bool:
        self.state = "off"
        return False

    def _head(self, ch: str) -> bool:
        """One character of the head; True when it completes it (``ch`` opens the arguments)."""
        step = _HEAD_STEPS[self._step]
        if step is _NAME:
            if not self._name_text:
                if ch in _WS:
                    return False
                if ch != '"':
                    return self._off()
            self._name_text += ch
            if len(self._name_text) > MAX_NAME:
                return self._off()
            if self._escape:
                self._escape = False
            elif ch == "\\":
                self._escape = True
            elif ch == '"' and len(self._name_text) > 1:
                try:
                    self.name = json.loads(self._name_text)
                except ValueError:  # a control character or a bad escape: not a call's name
                    return self._off()
                self._step += 1
            return False
        if self._matched == 0 and ch in _WS:
            return False
        if ch != step[self._matched]:
            return self._off()
        self._matched += 1
        if self._matched < len(step):
            return False
        self._matched = 0
        self._step += 1
        if self._step < len(_HEAD_STEPS):
            return False
        self.state, self._depth = "arguments", 1
        return True

    def _arguments(self, ch: str) -> None:
        if self._in_string:
            if self._escape:
                self._escape = False
            elif ch == "\\":
                self._escape = True
            elif ch == '"':
                self._in_string = False
        elif ch == '"':
            self._in_string = True
        elif ch in "{[":
            self._depth += 1
        elif ch in "}]":
            self._depth -= 1
            if self._depth == 0:
                self.state = "after"


def _arguments_text(arguments: Any) -> str:
    if isinstance(arguments, str):
        try:
            json.loads(arguments)
            return arguments
        except ValueError:
            pass
    return json.dumps(arguments if arguments is not None else {}, ensure_ascii=False)


@dataclass
class ToolStream:
    """Splits streamed answer text into content and tool calls.

    Trailing whitespace is held until more content follows, so that the newlines around calls
    do not become content next to the calls, whatever the chunking.

    ``incremental`` (streamed answers): a call in the ``json_tools`` syntax comes out as
    ``CallDelta`` pieces while it is written (see ``ArgumentsScanner``); such a call is the
    client's once its head is out, so it is kept as streamed even if it ends up malformed or cut
    (OpenAI's arguments may be invalid JSON too). Every other call is a ``ParsedCall`` at its
    end, and one that does not parse is content.
    """

    syntax: ToolSyntax
    tools: tuple[Tool, ...]
    parallel: bool = True
    incremental: bool = False
    calls: list[ParsedCall] = field(default_factory=list)
    _state: Any = None
    _call_text: str = ""
    _in_call: bool = False
    _scanner: ArgumentsScanner | None = None
    _streamed: str = ""  # the arguments text sent so far for the call being streamed
    _blank: str = ""

    def __post_init__(self) -> None:
        from mlx_lm.generate import TextStateMachine

        transitions = {
            "normal": [(self.syntax.start, "tool")],
            "tool": [(self.syntax.end, "normal")] if self.syntax.end else [],
        }
        self._state = TextStateMachine(transitions).make_state("normal")
        self._tool_dicts = [t.openai_dict() for t in self.tools]
        self._scans = self.incremental and self.syntax.parser is _json_tools_parser()

    def feed(self, text: str) -> list[Piece]:
        from mlx_lm.generate import TextStateMachine

        self._state, segments = TextStateMachine.split(self._state, text)
        return self._segments(segments)

    def finish(self) -> list[Piece]:
        """The end of the answer: what the state machine held back, and an unclosed call."""
        from mlx_lm.generate import TextStateMachine

        self._state, held, state = TextStateMachine.flush(self._state)
        out = self._segments([(state, held)])
        if state == "tool" and self._in_call:
            out += self._close_call(closed=False)
        if self._blank and not self.calls:
            out.append(self._blank)
        self._blank = ""
        return out

    def _segments(self, segments: list[tuple[str | None, str]]) -> list[Piece]:
        out: list[Piece] = []
        previous = None
        for state, text in segments:
            if state == "tool":
                out += self._call_piece(text)
            else:
                if previous == "tool":
                    out += self._close_call()
                out += self._content(text)
            previous = state
        return out

    def _content(self, text: str) -> list[Piece]:
        """Content, less trailing whitespace, which waits for what comes next."""
        kept = text.rstrip()
        if not kept:
            self._blank += text
            return []
        out, self._blank = self._blank + kept, text[len(kept) :]
        return [out]

    def _call_piece(self, text: str) -> list[Piece]:
        """Text inside a call: kept for the parser, and streamed when the call can be."""
        if not self._in_call:
            self._in_call = True
            # A second call without parallel_tool_calls is dropped at its end: never streamed.
            if self._scans and (self.parallel or not self.calls):
                self._scanner = ArgumentsScanner()
        self._call_text += text
        if self._scanner is None:
            return []
        head_done, arguments = self._scanner.feed(text)
        out: list[Piece] = []
        if head_done:
            call = ParsedCall(
                len(self.calls), "call_" + uuid.uuid4().hex[:24], self._scanner.name or "", ""
            )
            self.calls.append(call)
            out.append(CallDelta(call.index, call.id, call.name))
        if arguments:
            self._streamed += arguments
            out.append(CallDelta(self.calls[-1].index, arguments=arguments))
        if self._scanner.state == "off":
            self._scanner = None  # not the streamable shape: parsed whole at its end
        return out

    def _close_call(self, closed: bool = True) -> list[Piece]:
        """End one call; ``closed``: its end marker was seen (some syntaxes have none)."""
        raw, self._call_text, self._in_call = self._call_text, "", False
        scanner, self._scanner = self._scanner, None
        if scanner is not None and scanner.state != "head":
            return self._close_streamed(raw, scanner)
        try:
            parsed = self.syntax.parser(raw, self._tool_dicts)
            items = parsed if isinstance(parsed, list) else [parsed]
            made = [(str(item["name"]), _arguments_text(item.get("arguments"))) for item in items]
        except Exception as e:  # not a call after all: the text goes back to the client
            if not closed and (cut := self._cut_call(raw)):
                return cut
            log.info("tool call text did not parse (%s: %s)", type(e).__name__, e)
            end = (self.syntax.end or "") if closed else ""
            return self._content(self.syntax.start + raw + end)
        out: list[Piece] = []
        for name, arguments in made:
            if self.calls and not self.parallel:
                log.info("dropped a second tool call: parallel_tool_calls is false")
                continue
            call = ParsedCall(len(self.calls), "call_" + uuid.uuid4().hex[:24], name, arguments)
            self.calls.append(call)
            out.append(call)
        return out

    def _cut_call(self, raw: str) -> list[Piece]:
        """A call the answer's end cut (``max_tokens``) and that was not streamed: the call
        with the arguments written so far once its name is out, as a streamed answer sends it
        (and OpenAI answers a cut call: ``tool_calls``, ``finish_reason: "length"``)."""
        if self.syntax.parser is not _json_tools_parser() or (self.calls and not self.parallel):
            return []
        scanner = ArgumentsScanner()
        head_done, arguments = scanner.feed(raw)
        if not head_done:
            return []
        call = ParsedCall(
            len(self.calls), "call_" + uuid.uuid4().hex[:24], scanner.name or "", arguments
        )
        self.calls.append(call)
        return [call]

    def _close_streamed(self, raw: str, scanner: ArgumentsScanner) -> list[Piece]:
        """A streamed call ends: every argument character went out as it came, so nothing is
        left to send; the whole body is still parsed, to log a call the client got malformed."""
        arguments, self._streamed = self._streamed, ""
        self.calls[-1] = dataclasses.replace(self.calls[-1], arguments=arguments)
        try:
            parsed = self.syntax.parser(raw, self._tool_dicts)
            if json.loads(arguments) != parsed["arguments"]:
                log.info("a streamed tool call's body repeats its arguments: kept as streamed")
        except Exception as e:
            log.info(
                "a streamed tool call is malformed (%s: %s): kept as streamed (%s)",
                type(e).__name__,
                e,
                scanner.state,
            )
        return []
