"""Request bodies of /v1/chat/completions and /v1/completions, validated into one frozen value.

Unknown fields are ignored (clients send many optional ones), but a field the worker reads is
checked, and a bad one is a 400 in the OpenAI error shape naming the parameter. Sampling is
greedy by default, as in mlx_lm.server; without ``max_tokens`` an answer runs until EOS or the
end of the context, as OpenAI and vLLM do (the server resolves the budget, ``token_budget``).

System messages may come anywhere (OpenAI ``system`` and ``developer``, Anthropic's
mid-conversation system messages), but many chat templates accept one system message, first:
``fold_system_messages`` folds them with the rule the proxy also applies for external
backends (``router.kernel.system_messages``), so a conversation renders the same on every turn and
its prompt cache keeps hitting.

Tools (``tools``, ``tool_choice``, ``parallel_tool_calls``), assistant ``tool_calls`` and
``tool`` messages, and ``response_format`` are kept here as plain values; JSON schemas are kept
as canonical JSON text so that the request stays an immutable value
(``router.worker.decoding.tools`` renders them into the prompt,
``router.worker.decoding.constrain`` compiles them).
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any, Literal

import orjson

from router.kernel.errors import RouterError, bad_request
from router.kernel.request_rules import MAX_N, integer, logit_bias, logprobs, number, seed, typed
from router.kernel.system_messages import escape_text, fold
from router.kernel.worker_contract import (
    DRAFT_SOURCE_FIELD,
    DRAFT_TOKENS_FIELD,
    MAX_DRAFT_TOKENS,
    REQUEST_DRAFT_SOURCES,
)

# Without a known context length (a model config without max_position_embeddings), an answer
# that names no limit stops here.
UNKNOWN_CONTEXT_MAX_TOKENS = 4096
DEFAULT_TEMPERATURE = 0.0
MAX_STOP_STRINGS = 16
# The stop scanner holds back as much text as the longest stop string: a bound on both.
MAX_STOP_CHARS = 1024
MAX_TOOLS = 128  # OpenAI's own limit
MAX_TOOL_CALLS_PER_MESSAGE = 128
# Schemas are walked recursively (templates, the constraint compiler): a hostile nesting depth
# is a 400 here, not a RecursionError later.
MAX_SCHEMA_DEPTH = 64
# OpenAI's rule for function names; it also keeps names safe inside prompts and grammars.
TOOL_NAME = re.compile(r"[A-Za-z0-9_-]{1,64}")

Kind = Literal["chat", "completion"]
ToolChoice = Literal["auto", "none", "required"]
ResponseFormat = Literal["text", "json_object", "json_schema"]


@dataclass(frozen=True)
class ToolCall:
    """One call in an assistant message: ``arguments`` is the JSON object text as sent."""

    id: str
    name: str
    arguments: str


@dataclass(frozen=True)
class Message:
    role: str
    content: str
    tool_calls: tuple[ToolCall, ...] = ()
    tool_call_id: str | None = None
    name: str | None = None


@dataclass(frozen=True)
class Tool:
    name: str
    description: str | None = None
    parameters: str = '{"type":"object"}'  # the JSON schema, canonical JSON text

    def openai_dict(self) -> dict[str, Any]:
        """The ``{"type": "function", "function": {...}}`` shape chat templates expect."""
        function: dict[str, Any] = {"name": self.name}
        if self.description is not None:
            function["description"] = self.description
        function["parameters"] = orjson.loads(self.parameters)
        return {"type": "function", "function": function}


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
    # None: until EOS or the end of the context; the server sets the budget (token_budget)
    max_tokens: int | None = None
    stop: tuple[str, ...] = ()
    seed: int | None = None
    stream: bool = False
    include_usage: bool = False
    # vLLM's stream_options.continuous_usage_stats; here the first chunk carries the prompt's
    # size (what Anthropic's message_start reports) and the last the whole usage.
    continuous_usage: bool = False
    num_draft_tokens: int | None = None  # None: the worker's --num-draft-tokens
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    repetition_penalty: float = 1.0
    logit_bias: tuple[tuple[int, float], ...] = ()
    tools: tuple[Tool, ...] = ()
    tool_choice: ToolChoice = "none"
    forced_tool: str | None = None  # a named tool_choice (tool_choice is then "required")
    parallel_tool_calls: bool = True
    response_format: ResponseFormat = "text"
    response_schema: str | None = None  # json_schema's schema, canonical JSON text
    # A compiled decoding constraint (router.worker.decoding.constrain.Constraint), attached by the
    # server after tokenizing; processors_for turns it into a logits processor per job.
    constraint: Any = None
    # OpenAI Predicted Outputs: the expected text of the answer. The speculative lane drafts
    # from it; the batching lane ignores it (the answer is the same, only slower to come).
    prediction: str | None = None
    # The speculative lane's draft source for this request (``draft_model``,
    # ``prompt_lookup`` or ``suffix``; None: the lane's own). A prediction still wins; the
    # batching lane ignores it, like ``prediction``.
    draft_source: str | None = None
    # Log-probabilities of the emitted tokens, with this many alternatives each (chat's
    # ``logprobs: true`` + ``top_logprobs``, completions' ``logprobs``); None: not asked.
    logprobs: int | None = None
    n: int = 1  # choices: one job each, sharing the prompt's prefill (the server's)

    @property
    def budget(self) -> int:
        """The new tokens the engine may generate (set by ``token_budget`` before it runs)."""
        if self.max_tokens is None:
            raise RuntimeError("max_tokens is resolved by token_budget before generation")
        return self.max_tokens

    @property
    def calls_tools(self) -> bool:
        """Whether the answer is parsed for tool calls: tools given, ``tool_choice`` not none."""
        return bool(self.tools) and self.tool_choice != "none"


def parse_generation_request(body: Any, kind: Kind) -> GenerationRequest:
    if not isinstance(body, Mapping):
        raise bad_request("the request body must be a JSON object")
    source: dict[str, Any] = (
        {"messages": _messages(body)} if kind == "chat" else {"prompt": _prompt(body)}
    )
    stream_options = typed(body, "stream_options", Mapping, {})
    tooling = _tooling(body) if kind == "chat" else {}
    return GenerationRequest(
        kind=kind,
        model=typed(body, "model", str, None),
        **source,
        temperature=number(body, "temperature", DEFAULT_TEMPERATURE, 0.0, 2.0),
        top_p=number(body, "top_p", 1.0, 0.0, 1.0),
        top_k=integer(body, "top_k", 0, 0, None),
        min_p=number(body, "min_p", 0.0, 0.0, 1.0),
        max_tokens=_max_tokens(body),
        stop=_stop(body),
        seed=_seed(body),
        stream=typed(body, "stream", bool, False),
        include_usage=typed(stream_options, "include_usage", bool, False),
        continuous_usage=typed(stream_options, "continuous_usage_stats", bool, False),
        num_draft_tokens=integer(body, DRAFT_TOKENS_FIELD, None, 0, MAX_DRAFT_TOKENS),
        presence_penalty=number(body, "presence_penalty", 0.0, -2.0, 2.0),
        frequency_penalty=number(body, "frequency_penalty", 0.0, -2.0, 2.0),
        repetition_penalty=number(body, "repetition_penalty", 1.0, 0.0, None),
        logit_bias=logit_bias(body),
        **tooling,
        **_response_format(body),
        prediction=_prediction(body),
        draft_source=_draft_source(body),
        logprobs=logprobs(body, chat=kind == "chat"),
        n=integer(body, "n", 1, 1, MAX_N),
    )


def _max_tokens(body: Mapping[str, Any]) -> int | None:
    key = "max_completion_tokens" if body.get("max_completion_tokens") is not None else "max_tokens"
    return integer(body, key, None, 1, None)


def token_budget(requested: int | None, prompt_tokens: int, context_length: int | None) -> int:
    """New tokens an answer may have: what the client asked, never past the context's end.

    A limit beyond the context is shortened rather than refused (agents ask for 32000 on
    any model): the answer then ends with ``finish_reason`` ``length``, as at any limit.
    """
    if context_length is None:
        return requested or UNKNOWN_CONTEXT_MAX_TOKENS
    room = max(1, context_length - prompt_tokens)
    return min(requested, room) if requested else room


def fit_vocabulary(request: GenerationRequest, vocab_size: int) -> GenerationRequest:
    """``request`` checked against the model's vocabulary, at the lane's boundary: a token id
    at or past ``vocab_size`` would index outside the logits (MLX does not check: a write
    there corrupts the process's memory), so it is the client's 400. A ``top_k`` covering the
    whole vocabulary filters nothing and is dropped (mlx-lm refuses one that large)."""
    for ident, _ in request.logit_bias:
        if ident >= vocab_size:
            raise bad_request(
                f"'logit_bias' names token {ident}; the vocabulary has {vocab_size} tokens",
                param="logit_bias",
            )
    if isinstance(request.prompt, tuple) and max(request.prompt) >= vocab_size:
        raise bad_request(
            f"'prompt' holds a token id outside the vocabulary ({vocab_size} tokens)",
            param="prompt",
        )
    if request.top_k >= vocab_size:
        return dataclasses.replace(request, top_k=0)
    return request


def prompt_chars(request: GenerationRequest) -> int:
    """Characters of the request's own text that its prompt will hold (a template only adds)."""
    if request.kind == "completion":
        return len(request.prompt)  # a string's characters, or the token ids' count
    return sum(
        len(m.content) + sum(len(c.arguments) + len(c.name) for c in m.tool_calls)
        for m in request.messages
    ) + sum(len(t.parameters) + len(t.description or "") for t in request.tools)


def fits_context(request: GenerationRequest, context_length: int, max_token_chars: int) -> None:
    """A 400 for a prompt that cannot fit the context, decided before it is tokenized: no
    token spells more than ``max_token_chars`` characters, so a text longer than
    ``context_length`` of them cannot be fewer tokens than the context holds. What a lane
    tokenizes is thereby bounded by what it could serve, never by the body size alone."""
    if isinstance(request.prompt, tuple):
        tokens = len(request.prompt)
        if tokens >= context_length:
            raise context_exceeded(f"the prompt has {tokens} tokens", context_length)
        return
    chars = prompt_chars(request)
    if chars > context_length * max_token_chars:
        at_least = -(-chars // max_token_chars)
        raise context_exceeded(f"the prompt has at least {at_least} tokens", context_length)


def context_exceeded(what: str, context_length: int) -> RouterError:
    return RouterError(
        400,
        f"{what}; the context is {context_length}",
        code="context_length_exceeded",
    )


def _seed(body: Mapping[str, Any]) -> int | None:
    """The seed as MLX takes it (unsigned 64 bits; OpenAI's may be negative)."""
    value = seed(body)
    return None if value is None else value % 2**64


def _stop(body: Mapping[str, Any]) -> tuple[str, ...]:
    value = body.get("stop")
    if value is None:
        return ()
    items = [value] if isinstance(value, str) else value
    if (
        not isinstance(items, list)
        or len(items) > MAX_STOP_STRINGS
        or not all(isinstance(s, str) and 0 < len(s) <= MAX_STOP_CHARS for s in items)
    ):
        raise bad_request(
            f"'stop' must be a non-empty string of at most {MAX_STOP_CHARS} characters or a "
            f"list of up to {MAX_STOP_STRINGS} of them",
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
        messages.append(
            Message(
                item["role"],
                _content(item.get("content"), i),
                tool_calls=_tool_calls(item.get("tool_calls"), i),
                tool_call_id=_optional_str(item, "tool_call_id", i),
                name=_optional_str(item, "name", i),
            )
        )
    return fold_system_messages(messages)


def fold_system_messages(messages: list[Message]) -> tuple[Message, ...]:
    """System and developer messages anywhere -> one leading system message and user notes
    (``router.kernel.system_messages.fold``)."""
    return tuple(
        fold(
            messages,
            role=lambda m: m.role,
            text=lambda m: m.content,
            system=lambda text: Message("system", text),
            user=lambda text: Message("user", text),
            extend=_extended,
            escape=lambda m: replace(m, content=escape_text(m.content)),
        )
    )


def _extended(user: Message, notes: str, at_end: bool) -> Message:
    first, second = (user.content, notes) if at_end else (notes, user.content)
    return Message(
        "user", f"{first}\n\n{second}" if first and second else first or second, name=user.name
    )


def _optional_str(item: Mapping[str, Any], key: str, index: int) -> str | None:
    value = item.get(key)
    if value is not None and not isinstance(value, str):
        raise bad_request(f"messages[{index}].{key} must be a string", param="messages")
    return value


def _tool_calls(raw: Any, index: int) -> tuple[ToolCall, ...]:
    if raw is None:
        return ()
    where = f"messages[{index}].tool_calls"
    if not isinstance(raw, list) or len(raw) > MAX_TOOL_CALLS_PER_MESSAGE:
        raise bad_request(
            f"{where} must be an array of up to {MAX_TOOL_CALLS_PER_MESSAGE} calls",
            param="messages",
        )
    calls = []
    for j, call in enumerate(raw):
        function = call.get("function") if isinstance(call, Mapping) else None
        name = function.get("name") if isinstance(function, Mapping) else None
        if not isinstance(name, str) or not name:
            raise bad_request(f"{where}[{j}] must have a function name", param="messages")
        arguments = function.get("arguments", "{}") if isinstance(function, Mapping) else "{}"
        if isinstance(arguments, Mapping):  # lenient: some clients send the object itself
            try:
                arguments = orjson.dumps(arguments).decode()
            except TypeError:  # orjson's: an integer beyond 64 bits, a key that is no string
                arguments = None  # refused below, as any other malformed arguments
        if not isinstance(arguments, str) or not _is_json_object(arguments or "{}"):
            raise bad_request(
                f"{where}[{j}].function.arguments must be a JSON object as a string",
                param="messages",
            )
        call_id = call.get("id")
        calls.append(
            ToolCall(call_id if isinstance(call_id, str) else f"call_{j}", name, arguments or "{}")
        )
    return tuple(calls)


def _is_json_object(text: str) -> bool:
    try:
        value = orjson.loads(text)
    except orjson.JSONDecodeError:
        return False
    return isinstance(value, dict) and not _too_deep(value)


def _tooling(body: Mapping[str, Any]) -> dict[str, Any]:
    tools = _tools(body.get("tools"))
    parallel = typed(body, "parallel_tool_calls", bool, True)
    choice, forced = _tool_choice(body.get("tool_choice"), tools)
    return {
        "tools": tools,
        "tool_choice": choice,
        "forced_tool": forced,
        "parallel_tool_calls": parallel,
    }


def _tools(raw: Any) -> tuple[Tool, ...]:
    if raw is None:
        return ()
    if not isinstance(raw, list) or len(raw) > MAX_TOOLS:
        raise bad_request(f"'tools' must be an array of up to {MAX_TOOLS} tools", param="tools")
    tools: list[Tool] = []
    for i, item in enumerate(raw):
        function = item.get("function") if isinstance(item, Mapping) else None
        if not isinstance(function, Mapping) or item.get("type", "function") != "function":
            raise bad_request(
                f'tools[{i}] must be {{"type": "function", "function": {{...}}}}',
                param="tools",
            )
        name = function.get("name")
        if not isinstance(name, str) or not TOOL_NAME.fullmatch(name):
            raise bad_request(
                f"tools[{i}].function.name must be 1-64 letters, digits, '_' or '-'",
                param="tools",
            )
        if any(t.name == name for t in tools):
            raise bad_request(f"tools[{i}]: the name '{name}' is given twice", param="tools")
        description = function.get("description")
        if description is not None and not isinstance(description, str):
            raise bad_request(f"tools[{i}].function.description must be a string", param="tools")
        parameters = function.get("parameters", {"type": "object"})
        if not isinstance(parameters, Mapping) or _too_deep(parameters):
            raise bad_request(
                f"tools[{i}].function.parameters must be a JSON schema object nested at most "
                f"{MAX_SCHEMA_DEPTH} deep",
                param="tools",
            )
        tools.append(Tool(name, description, orjson.dumps(parameters).decode()))
    return tuple(tools)


def _too_deep(value: Any) -> bool:
    stack = [(value, 1)]
    while stack:
        item, depth = stack.pop()
        if depth > MAX_SCHEMA_DEPTH:
            return True
        children = (
            item.values() if isinstance(item, Mapping) else item if isinstance(item, list) else ()
        )
        stack.extend((child, depth + 1) for child in children)
    return False


def _tool_choice(raw: Any, tools: tuple[Tool, ...]) -> tuple[ToolChoice, str | None]:
    """``(tool_choice, forced tool name)``; the default is ``auto`` with tools, else ``none``."""
    if raw is None:
        return ("auto" if tools else "none"), None
    if raw in ("auto", "none", "required"):
        if raw == "required" and not tools:
            raise bad_request("tool_choice 'required' needs 'tools'", param="tool_choice")
        return raw, None
    function = raw.get("function") if isinstance(raw, Mapping) else None
    name = function.get("name") if isinstance(function, Mapping) else None
    if not isinstance(raw, Mapping) or raw.get("type") != "function" or not isinstance(name, str):
        raise bad_request(
            "'tool_choice' must be 'auto', 'none', 'required' or "
            '{"type": "function", "function": {"name": ...}}',
            param="tool_choice",
        )
    if not any(t.name == name for t in tools):
        raise bad_request(
            f"tool_choice names the function '{name}', which is not in 'tools'",
            param="tool_choice",
        )
    return "required", name


def _response_format(body: Mapping[str, Any]) -> dict[str, Any]:
    raw = typed(body, "response_format", Mapping, None)
    if raw is None:
        return {}
    kind = raw.get("type")
    if kind in ("text", "json_object"):
        return {"response_format": kind}
    if kind == "json_schema":
        spec = raw.get("json_schema")
        schema = spec.get("schema") if isinstance(spec, Mapping) else None
        if not isinstance(schema, Mapping) or _too_deep(schema):
            raise bad_request(
                "response_format json_schema needs 'json_schema': {'name': ..., 'schema': {...}}"
                f" with the schema nested at most {MAX_SCHEMA_DEPTH} deep",
                param="response_format",
            )
        return {"response_format": kind, "response_schema": orjson.dumps(schema).decode()}
    raise bad_request(
        "'response_format' type must be 'text', 'json_object' or 'json_schema'",
        param="response_format",
    )


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


def _prediction(body: Mapping[str, Any]) -> str | None:
    """``{"type": "content", "content": str | [{"type": "text", "text": str}, ...]}``."""
    raw = body.get("prediction")
    if raw is None:
        return None
    message = '\'prediction\' must be {"type": "content", "content": string or text parts}'
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


def _draft_source(body: Mapping[str, Any]) -> str | None:
    value = body.get(DRAFT_SOURCE_FIELD)
    if value is None:
        return None
    if value not in REQUEST_DRAFT_SOURCES:
        names = " or ".join(f"'{v}'" for v in REQUEST_DRAFT_SOURCES)
        raise bad_request(f"'{DRAFT_SOURCE_FIELD}' must be {names}", param=DRAFT_SOURCE_FIELD)
    return str(value)
