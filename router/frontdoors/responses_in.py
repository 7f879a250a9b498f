"""OpenAI Responses request -> the OpenAI chat request the router forwards (pure).

What maps where: ``instructions`` is the first, system message; ``input`` (a string, or a list
of items) becomes messages: message items keep their role (``developer`` becomes ``system``;
adjacent system messages join into one, since many chat templates accept only one),
``function_call`` items become an assistant message's ``tool_calls`` (adjacent calls, and the
assistant text just before them, join into one message), ``function_call_output`` items
become ``tool`` messages, ``compaction`` items the summary they carry (``responses_compact``,
as is a final ``compaction_trigger``), ``reasoning`` items are dropped (no backend here takes
them back).
A ``previous_response_id`` puts that response's conversation (its input and output, not its
instructions, as OpenAI does) before the new input. ``function`` tools map one to one; a
``namespace`` tool's functions are offered as ``<namespace>__<name>`` and the calls split
back; ``web_search`` is ignored (nothing here searches the web: the model gets no such tool);
any other tool type is refused. ``text.format`` becomes ``response_format`` (the lanes'
constrained decoding). ``top_logprobs`` (0..20) or ``include: ["message.output_text.logprobs"]``
asks for log-probabilities (chat's ``logprobs: true`` and ``top_logprobs``; the answer's
``output_text`` parts carry them). Fields that change the answer and are not supported are
refused with
a 400 naming them; the rest of the fields clients send (``reasoning``, ``include``,
``client_metadata``, ``service_tier``, ``truncation``...) are accepted and ignored.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from router.frontdoors import responses_compact
from router.frontdoors.common import str_field
from router.kernel.errors import RouterError, bad_request, not_found

MAX_INPUT_ITEMS = 4096
MAX_TOOLS = 128  # the lanes' limit, and OpenAI's
MAX_ID_CHARS = 256
MAX_METADATA = 16  # OpenAI's bounds on metadata
MAX_METADATA_KEY = 64
MAX_METADATA_VALUE = 512
NAMESPACE_SEPARATOR = "__"
IGNORED_TOOLS = frozenset(
    {"web_search", "web_search_preview", "web_search_2025_08_26", "web_search_preview_2025_03_11"}
)
DROPPED_ITEMS = frozenset({"reasoning"})
# Fields that would change the answer and that no backend here provides: a 400, never a
# silent difference.
REFUSED_FIELDS = {
    "background": "'background' is taken by POST /v1/responses only",
    "conversation": "the Conversations API is not supported; use previous_response_id",
    "prompt": "prompt templates are not supported",
    "max_tool_calls": "'max_tool_calls' is not supported",
    "context_management": "server-side context management is not supported",
}


@dataclass(frozen=True, slots=True)
class ResponsesRequest:
    """The translated request and what the answer's translation needs from it."""

    openai: dict[str, Any]
    model: str
    stream: bool
    store: bool
    # The conversation as chat messages, without the instructions: what a stored response
    # keeps (with its answer appended) for a later previous_response_id.
    conversation: list[dict[str, Any]]
    echo: dict[str, Any]  # request fields a Response object repeats
    namespaces: dict[str, tuple[str, str]] = field(default_factory=dict)  # joined -> parts
    # The answer is a summary, returned as one compaction item (``responses_compact``).
    compaction: bool = False


def previous_id(body: dict[str, Any]) -> str | None:
    value = body.get("previous_response_id")
    if value is None:
        return None
    if not isinstance(value, str) or not value or len(value) > MAX_ID_CHARS:
        raise bad_request(
            "'previous_response_id' must be a response id", param="previous_response_id"
        )
    return value


def missing(resp_id: str, param: str | None = None) -> RouterError:
    # The same answer for an id that never existed, one evicted, and another client's.
    return not_found(
        f"Response with id '{resp_id[:256]}' not found (responses are "
        "kept in memory, per client, and the oldest are evicted)",
        param=param,
        code="response_not_found",
    )


def to_openai(
    body: dict[str, Any], history: Sequence[dict[str, Any]] = (), *, compact: bool = False
) -> ResponsesRequest:
    """``history``: the chat messages of the previous response's conversation. ``compact``
    (``/v1/responses/compact``), or a final ``compaction_trigger`` input item: the answer
    is the conversation's summary."""
    model = str_field(body, "model", required=True)
    assert model is not None
    for key, why in REFUSED_FIELDS.items():
        if body.get(key) not in (None, False, 0):
            raise bad_request(why, param=key, code="unsupported_parameter")
    instructions = str_field(body, "instructions")
    items = body.get("input")
    if isinstance(items, list):
        items, triggered = responses_compact.split_trigger(items)
        compact = compact or triggered
    conversation = [*history, *_input(items)]
    if len(conversation) > MAX_INPUT_ITEMS:
        raise bad_request(f"the conversation has more than {MAX_INPUT_ITEMS} items", param="input")
    messages = _join_systems(
        ([{"role": "system", "content": instructions}] if instructions else []) + conversation
    )
    if not messages:
        raise bad_request("'input' is required and must not be empty", param="input")
    if compact:
        messages.append({"role": "user", "content": responses_compact.PROMPT})
    out: dict[str, Any] = {"model": model, "messages": messages}
    tools, namespaces = _tools(body.get("tools"))
    if tools:
        out["tools"] = tools
    # A compaction keeps the tools and tool_choice as sent: the prompt up to the new message
    # is then the one the lanes' prompt cache holds (tool_choice "none" changes how some
    # templates render the tools). PROMPT asks for text; a call in the answer is ignored.
    choice = _tool_choice(body.get("tool_choice"), namespaces)
    if choice is not None:
        out["tool_choice"] = choice
    parallel = _flag(body, "parallel_tool_calls", None)
    if tools and parallel is not None:
        out["parallel_tool_calls"] = parallel
    out.update(_sampling(body))
    top_logprobs = _logprobs(body)
    if top_logprobs is not None:
        out["logprobs"], out["top_logprobs"] = True, top_logprobs
    text = _text(body.get("text"))
    if text is not None:
        out["response_format"] = text
    user = body.get("safety_identifier") or body.get("user")
    if isinstance(user, str) and user:
        out["user"] = user[:MAX_ID_CHARS]
    cache_key = body.get("prompt_cache_key")
    if cache_key is not None:
        if not isinstance(cache_key, str) or len(cache_key) > MAX_ID_CHARS:
            raise bad_request(
                f"'prompt_cache_key' must be a string of up to {MAX_ID_CHARS} characters",
                param="prompt_cache_key",
            )
        out["prompt_cache_key"] = cache_key  # OpenAI's chat API has the same field
    stream = bool(_flag(body, "stream", False))
    if stream:
        out["stream"] = True
        out["stream_options"] = {"include_usage": True}
    store = bool(_flag(body, "store", True)) and not compact
    echo = {
        "instructions": instructions,
        "max_output_tokens": out.get("max_tokens"),
        "metadata": _metadata(body.get("metadata")),
        "parallel_tool_calls": parallel is not False,
        "previous_response_id": body.get("previous_response_id"),
        "prompt_cache_key": cache_key,
        "store": store,
        "temperature": out.get("temperature"),
        "text": {"format": body["text"]["format"] if text is not None else {"type": "text"}},
        "tool_choice": body.get("tool_choice") or "auto",
        "tools": [
            t
            for t in body.get("tools") or []
            if isinstance(t, dict) and _kind(t.get("type")) not in IGNORED_TOOLS
        ],
        "top_logprobs": body.get("top_logprobs"),
        "top_p": out.get("top_p"),
        "user": out.get("user"),
    }
    return ResponsesRequest(out, model, stream, store, conversation, echo, namespaces, compact)


def _flag(body: dict[str, Any], key: str, default: bool | None) -> bool | None:
    value = body.get(key)
    if value is None:
        return default
    if not isinstance(value, bool):
        raise bad_request(f"'{key}' must be a boolean", param=key)
    return value


LOGPROBS_INCLUDE = "message.output_text.logprobs"
MAX_TOP_LOGPROBS = 20  # OpenAI's range


def _logprobs(body: dict[str, Any]) -> int | None:
    """The alternatives per token when the request asks for log-probabilities, else None."""
    top = body.get("top_logprobs")
    if top is not None and (
        not isinstance(top, int) or isinstance(top, bool) or not 0 <= top <= MAX_TOP_LOGPROBS
    ):
        raise bad_request(
            f"'top_logprobs' must be an integer between 0 and {MAX_TOP_LOGPROBS}",
            param="top_logprobs",
        )
    include = body.get("include")
    asked = isinstance(include, list) and LOGPROBS_INCLUDE in include
    return top if top is not None else (0 if asked else None)


def _sampling(body: dict[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    limit = body.get("max_output_tokens")
    if limit is not None:
        if not isinstance(limit, int) or isinstance(limit, bool) or limit < 1:
            raise bad_request(
                "'max_output_tokens' must be a positive integer", param="max_output_tokens"
            )
        out["max_tokens"] = limit
    for key in ("temperature", "top_p"):
        value = body.get(key)
        if value is not None:
            if not isinstance(value, int | float) or isinstance(value, bool):
                raise bad_request(f"'{key}' must be a number", param=key)
            out[key] = value
    return out


# --- input --------------------------------------------------------------------------------


def _input(value: Any) -> list[dict[str, Any]]:
    if value is None:
        return []
    if isinstance(value, str):
        return [{"role": "user", "content": value}]
    if not isinstance(value, list):
        raise bad_request("'input' must be a string or an array of items", param="input")
    if len(value) > MAX_INPUT_ITEMS:
        raise bad_request(f"'input' has more than {MAX_INPUT_ITEMS} items", param="input")
    messages: list[dict[str, Any]] = []
    for i, item in enumerate(value):
        at = f"input[{i}]"
        if not isinstance(item, dict):
            raise bad_request(f"'{at}' must be an object", param=at)
        kind = _kind(item.get("type", "message"))
        if kind == "message":
            messages.append(_message(item, at))
        elif kind == "function_call":
            _append_call(messages, _function_call(item, at))
        elif kind == "function_call_output":
            messages.append(_function_output(item, at))
        elif kind in responses_compact.ITEMS:
            messages.append(responses_compact.summary_message(responses_compact.decode(item, at)))
        elif kind not in DROPPED_ITEMS:
            raise bad_request(
                f"'{at}': input items of type '{kind}' are not supported",
                param=at,
                code="unsupported_value",
            )
    return messages


def _kind(value: Any) -> str | None:
    """A ``type`` or ``role`` as a name to look up: any other JSON value (an array is not
    even hashable) is no name."""
    return value if isinstance(value, str) else None


def _append_call(messages: list[dict[str, Any]], call: dict[str, Any]) -> None:
    """Adjacent calls are one assistant turn; so is the assistant's text just before them."""
    last = messages[-1] if messages else None
    if last is not None and last["role"] == "assistant":
        last.setdefault("tool_calls", []).append(call)
        if not last.get("content"):
            last["content"] = None
        return
    messages.append({"role": "assistant", "content": None, "tool_calls": [call]})


ROLES = {"user": "user", "assistant": "assistant", "system": "system", "developer": "system"}
TEXT_PARTS = frozenset({"input_text", "output_text", "text", "refusal"})


def _message(item: dict[str, Any], at: str) -> dict[str, Any]:
    role = ROLES.get(_kind(item.get("role")) or "")
    if role is None:
        raise bad_request(f"'{at}.role' must be user, assistant, system or developer", param=at)
    content = item.get("content")
    if isinstance(content, str):
        return {"role": role, "content": content}
    if not isinstance(content, list):
        raise bad_request(f"'{at}.content' must be a string or an array of parts", param=at)
    parts: list[dict[str, Any]] = []
    for j, part in enumerate(content):
        where = f"{at}.content[{j}]"
        kind = _kind(part.get("type")) if isinstance(part, dict) else None
        if kind in TEXT_PARTS:
            text = part.get("refusal" if kind == "refusal" else "text")
            if not isinstance(text, str):
                raise bad_request(f"'{where}.text' must be a string", param=where)
            parts.append({"type": "text", "text": text})
        elif kind == "input_image" and role == "user":
            parts.append(_image(part, where))
        else:
            raise bad_request(
                f"'{where}': content parts of type '{kind}' are not supported "
                f"in a{'n' if role == 'assistant' else ''} {role} message",
                param=where,
                code="unsupported_value",
            )
    if all(p["type"] == "text" for p in parts):
        return {"role": role, "content": "\n".join(p["text"] for p in parts)}
    return {"role": role, "content": parts}


def _image(part: dict[str, Any], at: str) -> dict[str, Any]:
    url = part.get("image_url")
    if not isinstance(url, str) or not url:
        raise bad_request(
            f"'{at}': only images given by 'image_url' are supported",
            param=at,
            code="unsupported_value",
        )
    return {"type": "image_url", "image_url": {"url": url}}


def _id(item: dict[str, Any], key: str, at: str) -> str:
    value = item.get(key)
    if not isinstance(value, str) or not value or len(value) > MAX_ID_CHARS:
        raise bad_request(
            f"'{at}.{key}' must be a non-empty string of up to {MAX_ID_CHARS} characters", param=at
        )
    return value


def _function_call(item: dict[str, Any], at: str) -> dict[str, Any]:
    call_id, name = _id(item, "call_id", at), _id(item, "name", at)
    namespace = item.get("namespace")
    if isinstance(namespace, str) and namespace:
        name = namespace + NAMESPACE_SEPARATOR + name
    arguments = item.get("arguments", "")
    if not isinstance(arguments, str):
        raise bad_request(f"'{at}.arguments' must be a string (JSON text)", param=at)
    return {
        "id": call_id,
        "type": "function",
        "function": {"name": name, "arguments": arguments or "{}"},
    }


def _function_output(item: dict[str, Any], at: str) -> dict[str, Any]:
    call_id = _id(item, "call_id", at)
    output = item.get("output")
    if isinstance(output, list):
        texts = []
        for j, part in enumerate(output):
            where = f"{at}.output[{j}]"
            if (
                not isinstance(part, dict)
                or _kind(part.get("type")) not in TEXT_PARTS
                or not isinstance(part.get("text"), str)
            ):
                raise bad_request(
                    f"'{where}': only text is supported in a function call's output",
                    param=where,
                    code="unsupported_value",
                )
            texts.append(part["text"])
        output = "\n".join(texts)
    elif not isinstance(output, str):
        raise bad_request(f"'{at}.output' must be a string or an array of text parts", param=at)
    return {"role": "tool", "tool_call_id": call_id, "content": output}


def _join_systems(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Adjacent system messages as one (many chat templates accept a single one). Each run
    is joined once, at its end: linear in the conversation (joining message by message
    copied the text so far at each step, quadratic over a long stored conversation)."""
    out: list[dict[str, Any]] = []
    run: list[str] = []  # the texts of the system messages just before, not joined yet

    def close_run() -> None:
        if len(run) > 1:
            out[-1] = {"role": "system", "content": "\n\n".join(run)}
        run.clear()

    for m in messages:
        text = m["content"] if m["role"] == "system" else None
        if isinstance(text, str) and run:
            run.append(text)
            continue
        close_run()
        out.append(m)
        if isinstance(text, str):
            run.append(text)
    close_run()
    return out


# --- tools --------------------------------------------------------------------------------


def _tools(tools: Any) -> tuple[list[dict[str, Any]], dict[str, tuple[str, str]]]:
    if tools is None:
        return [], {}
    if not isinstance(tools, list):
        raise bad_request("'tools' must be an array", param="tools")
    out: list[dict[str, Any]] = []
    namespaces: dict[str, tuple[str, str]] = {}
    for i, tool in enumerate(tools):
        at = f"tools[{i}]"
        kind = _kind(tool.get("type")) if isinstance(tool, dict) else None
        if kind == "function":
            out.append(_function(tool, at, None))
        elif kind == "namespace":
            ns = _id(tool, "name", at)
            inner = tool.get("tools")
            if not isinstance(inner, list):
                raise bad_request(f"'{at}.tools' must be an array", param=at)
            for j, sub in enumerate(inner):
                where = f"{at}.tools[{j}]"
                if not isinstance(sub, dict) or sub.get("type") != "function":
                    raise bad_request(
                        f"'{where}': only function tools are supported in a namespace",
                        param=where,
                        code="unsupported_value",
                    )
                function = _function(sub, where, ns)
                namespaces[function["function"]["name"]] = (ns, sub["name"])
                out.append(function)
        elif kind not in IGNORED_TOOLS:
            raise bad_request(
                f"'{at}': tools of type '{kind}' are not supported (only "
                "'function' and 'namespace' tools)",
                param=at,
                code="unsupported_value",
            )
        if len(out) > MAX_TOOLS:
            raise bad_request(f"'tools' holds more than {MAX_TOOLS} functions", param="tools")
    return out, namespaces


def _function(tool: dict[str, Any], at: str, namespace: str | None) -> dict[str, Any]:
    name = _id(tool, "name", at)
    if namespace is not None:
        name = namespace + NAMESPACE_SEPARATOR + name
    function: dict[str, Any] = {"name": name}
    description = tool.get("description")
    if isinstance(description, str):
        function["description"] = description
    parameters = tool.get("parameters")
    if parameters is not None:
        if not isinstance(parameters, dict):
            raise bad_request(f"'{at}.parameters' must be an object (a JSON schema)", param=at)
        function["parameters"] = parameters
    else:
        function["parameters"] = {"type": "object", "properties": {}}
    if tool.get("strict") is True:
        function["strict"] = True
    return {"type": "function", "function": function}


def _tool_choice(choice: Any, namespaces: dict[str, tuple[str, str]]) -> Any:
    if choice is None:
        return None
    if choice in ("auto", "none", "required"):
        return choice
    if isinstance(choice, dict) and choice.get("type") == "function":
        name = _id(choice, "name", "tool_choice")
        namespace = choice.get("namespace")
        if isinstance(namespace, str) and namespace:
            name = namespace + NAMESPACE_SEPARATOR + name
        return {"type": "function", "function": {"name": name}}
    raise bad_request(
        '\'tool_choice\' must be auto, none, required or {"type": "function", "name": ...}',
        param="tool_choice",
        code="unsupported_value",
    )


# --- text format and metadata ---------------------------------------------------------------


def _text(text: Any) -> dict[str, Any] | None:
    """``text.format`` as a chat ``response_format`` (None: plain text)."""
    if text is None:
        return None
    if not isinstance(text, dict):
        raise bad_request("'text' must be an object", param="text")
    fmt = text.get("format")
    if fmt is None:
        return None
    kind = fmt.get("type") if isinstance(fmt, dict) else None
    if kind == "text":
        return None
    if kind == "json_object":
        return {"type": "json_object"}
    if kind == "json_schema":
        assert isinstance(fmt, dict)
        schema = fmt.get("schema")
        if not isinstance(schema, dict):
            raise bad_request(
                "'text.format.schema' must be an object (a JSON schema)", param="text.format"
            )
        inner: dict[str, Any] = {
            "name": fmt.get("name") if isinstance(fmt.get("name"), str) else "answer",
            "schema": schema,
        }
        if isinstance(fmt.get("strict"), bool):
            inner["strict"] = fmt["strict"]
        return {"type": "json_schema", "json_schema": inner}
    raise bad_request(
        "'text.format.type' must be text, json_object or json_schema",
        param="text.format",
        code="unsupported_value",
    )


def _metadata(metadata: Any) -> dict[str, str]:
    if metadata is None:
        return {}
    if (
        not isinstance(metadata, dict)
        or len(metadata) > MAX_METADATA
        or not all(
            isinstance(k, str)
            and isinstance(v, str)
            and len(k) <= MAX_METADATA_KEY
            and len(v) <= MAX_METADATA_VALUE
            for k, v in metadata.items()
        )
    ):
        raise bad_request(
            f"'metadata' must be an object of up to {MAX_METADATA} string "
            f"pairs (keys up to {MAX_METADATA_KEY} characters, values up to "
            f"{MAX_METADATA_VALUE})",
            param="metadata",
        )
    return dict(metadata)
