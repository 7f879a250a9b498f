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
"""

from __future__ import annotations

import json
import logging
import threading
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from router.worker.constrain import CALL_END, CALL_START
from router.worker.protocol import GenerationRequest, Message, Tool

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


Piece = str | ParsedCall  # text content, or one complete call


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
    """Splits streamed answer text into content and parsed tool calls.

    Trailing whitespace is held until more content follows, so that the newlines around calls
    do not become content next to the calls, whatever the chunking.
    """

    syntax: ToolSyntax
    tools: tuple[Tool, ...]
    parallel: bool = True
    calls: list[ParsedCall] = field(default_factory=list)
    _state: Any = None
    _call_text: str = ""
    _blank: str = ""

    def __post_init__(self) -> None:
        from mlx_lm.generate import TextStateMachine

        transitions = {
            "normal": [(self.syntax.start, "tool")],
            "tool": [(self.syntax.end, "normal")] if self.syntax.end else [],
        }
        self._state = TextStateMachine(transitions).make_state("normal")
        self._tool_dicts = [t.openai_dict() for t in self.tools]

    def feed(self, text: str) -> list[Piece]:
        from mlx_lm.generate import TextStateMachine

        self._state, segments = TextStateMachine.split(self._state, text)
        return self._segments(segments)

    def finish(self) -> list[Piece]:
        """The end of the answer: what the state machine held back, and an unclosed call."""
        from mlx_lm.generate import TextStateMachine

        self._state, held, state = TextStateMachine.flush(self._state)
        out = self._segments([(state, held)])
        if state == "tool" and self._call_text:
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
                self._call_text += text
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

    def _close_call(self, closed: bool = True) -> list[Piece]:
        """Parse one call; ``closed``: its end marker was seen (some syntaxes have none)."""
        raw, self._call_text = self._call_text, ""
        try:
            parsed = self.syntax.parser(raw, self._tool_dicts)
            items = parsed if isinstance(parsed, list) else [parsed]
            made = [(str(item["name"]), _arguments_text(item.get("arguments"))) for item in items]
        except Exception as e:  # not a call after all: the text goes back to the client
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
