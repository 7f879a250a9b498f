"""Anthropic Messages request -> the OpenAI chat request the router forwards (pure).

What maps where: ``system`` (a string or text blocks) is the first, system message; a
``system`` entry inside ``messages`` (Claude Code's mid-conversation system messages) stays a
system message in its place (the lanes, and the proxy for a backend set to fold, fold it
into the prompt: ``router.kernel.system_messages``); text blocks join into one string (the
lanes take text only); ``image`` blocks become OpenAI image
parts (the MLX lanes refuse those with a 400; a vision backend takes them); an assistant's
``tool_use`` blocks become its ``tool_calls``; a user's ``tool_result`` blocks become ``tool``
messages, placed before the rest of that user turn as OpenAI requires; ``thinking`` blocks
are dropped (no backend here takes them back); ``cache_control`` is ignored. ``max_tokens``
is required, as Anthropic requires it. ``context_management`` edits are applied first
(``anthropic_context``); ``thinking`` (any type, ``adaptive`` included) and ``output_config``
are accepted and have no effect on the lanes.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import orjson

from router.frontdoors import anthropic_context
from router.frontdoors.common import counted, str_field
from router.kernel.errors import bad_request
from router.kernel.request_rules import typed

MAX_STOP_SEQUENCES = 16
DROPPED_BLOCKS = frozenset({"thinking", "redacted_thinking"})


@dataclass(frozen=True, slots=True)
class MessagesRequest:
    """The translated request and what the answer's translation needs from it."""

    openai: dict[str, Any]
    model: str
    stream: bool
    stop_sequences: tuple[str, ...]
    # context_management's applied_edits, or None when the request had no context_management
    applied_edits: tuple[dict[str, Any], ...] | None = None


def to_openai(body: dict[str, Any], *, for_count: bool = False) -> MessagesRequest:
    """``for_count``: a count_tokens request, which has no ``max_tokens``."""
    model = str_field(body, "model", required=True)
    assert model is not None
    out: dict[str, Any] = {"model": model}
    if not for_count:
        max_tokens = body.get("max_tokens")
        if not isinstance(max_tokens, int) or isinstance(max_tokens, bool) or max_tokens < 1:
            raise bad_request(
                "'max_tokens' is required and must be a positive integer", param="max_tokens"
            )
        out["max_tokens"] = max_tokens
    messages = _system(body.get("system"))
    raw = body.get("messages")
    if not isinstance(raw, list) or not raw:
        raise bad_request("'messages' is required and must be a non-empty array", param="messages")
    edited = anthropic_context.apply(body, raw)
    for i, message in enumerate(edited.messages):
        messages.extend(_message(message, i))
    out["messages"] = messages
    tools = _tools(body.get("tools"))
    if tools:
        out["tools"] = tools
        out.update(_tool_choice(body.get("tool_choice")))
    stops = _stop_sequences(body.get("stop_sequences"))
    if stops:
        out["stop"] = list(stops)
    for key in ("temperature", "top_p", "top_k"):
        value = typed(body, key, int if key == "top_k" else (int, float), None)
        if value is not None:
            out[key] = value
    metadata = body.get("metadata")
    if metadata is not None:
        if not isinstance(metadata, dict):
            raise bad_request("'metadata' must be an object", param="metadata")
        if isinstance(metadata.get("user_id"), str):
            out["user"] = metadata["user_id"]
    stream = body.get("stream", False)
    if not isinstance(stream, bool):
        raise bad_request("'stream' must be a boolean", param="stream")
    if stream and not for_count:
        # Anthropic reports usage at the end of every stream: ask the backend for it.
        out["stream"] = True
        # continuous_usage_stats: the first chunk has the prompt's size for message_start.
        out["stream_options"] = {"include_usage": True, "continuous_usage_stats": True}
    return MessagesRequest(
        out, model, stream and not for_count, stops, edited.applied if edited.requested else None
    )


def count_body(req: MessagesRequest) -> dict[str, Any]:
    """A lane's /tokenize body for count_tokens: what the lane renders into the prompt (the
    system, the messages, the tools and how they may be called), nothing it generates."""
    return counted(req.openai)


def _system(system: Any, at: str = "system") -> list[dict[str, Any]]:
    if system is None:
        return []
    if isinstance(system, str):
        return [{"role": "system", "content": system}] if system else []
    if isinstance(system, list):
        texts = []
        for block in system:
            if (
                not isinstance(block, dict)
                or block.get("type") != "text"
                or not isinstance(block.get("text"), str)
            ):
                raise bad_request(f"'{at}' blocks must be text blocks", param=at)
            texts.append(block["text"])
        return [{"role": "system", "content": "\n".join(texts)}] if texts else []
    raise bad_request(f"'{at}' must be a string or an array of text blocks", param=at)


def _message(message: Any, i: int) -> list[dict[str, Any]]:
    where = f"messages[{i}]"
    if not isinstance(message, dict):
        raise bad_request(f"'{where}' must be an object", param=where)
    role = message.get("role")
    if role not in ("user", "assistant", "system"):
        raise bad_request(f"'{where}.role' must be 'user', 'assistant' or 'system'", param=where)
    content = message.get("content")
    if role == "system":
        return _system(content if content is not None else "", f"{where}.content")
    if isinstance(content, str):
        return [{"role": role, "content": content}]
    if not isinstance(content, list):
        raise bad_request(f"'{where}.content' must be a string or an array of blocks", param=where)
    if role == "assistant":
        return [_assistant(content, where)]
    return _user(content, where)


def _assistant(blocks: list[Any], where: str) -> dict[str, Any]:
    texts: list[str] = []
    calls: list[dict[str, Any]] = []
    for j, block in enumerate(blocks):
        kind = _block_type(block, f"{where}.content[{j}]")
        if kind == "text":
            texts.append(_text(block, f"{where}.content[{j}]"))
        elif kind == "tool_use":
            calls.append(_tool_use(block, f"{where}.content[{j}]"))
        elif kind not in DROPPED_BLOCKS:
            raise bad_request(
                f"'{where}.content[{j}]': an assistant message cannot hold a '{kind}' block",
                param=where,
            )
    out: dict[str, Any] = {"role": "assistant", "content": "\n".join(texts) if texts else None}
    if calls:
        out["tool_calls"] = calls
    elif out["content"] is None:
        out["content"] = ""
    return out


def _user(blocks: list[Any], where: str) -> list[dict[str, Any]]:
    results: list[dict[str, Any]] = []
    parts: list[dict[str, Any]] = []
    for j, block in enumerate(blocks):
        at = f"{where}.content[{j}]"
        kind = _block_type(block, at)
        if kind == "text":
            parts.append({"type": "text", "text": _text(block, at)})
        elif kind == "image":
            parts.append(_image(block, at))
        elif kind == "tool_result":
            results.append(_tool_result(block, at))
        elif kind not in DROPPED_BLOCKS:
            raise bad_request(
                f"'{at}': '{kind}' blocks are not supported in a user message", param=where
            )
    out = list(results)  # tool results answer the previous assistant turn: they come first
    if parts:
        if all(p["type"] == "text" for p in parts):
            out.append({"role": "user", "content": "\n".join(p["text"] for p in parts)})
        else:
            out.append({"role": "user", "content": parts})
    elif not results:
        out.append({"role": "user", "content": ""})
    return out


def _block_type(block: Any, at: str) -> str:
    if not isinstance(block, dict) or not isinstance(block.get("type"), str):
        raise bad_request(f"'{at}' must be a content block with a 'type'", param=at)
    return str(block["type"])


def _text(block: dict[str, Any], at: str) -> str:
    text = block.get("text")
    if not isinstance(text, str):
        raise bad_request(f"'{at}.text' must be a string", param=at)
    return text


def _image(block: dict[str, Any], at: str) -> dict[str, Any]:
    source = block.get("source")
    if isinstance(source, dict) and source.get("type") == "base64":
        media, data = source.get("media_type"), source.get("data")
        if isinstance(media, str) and isinstance(data, str):
            return {"type": "image_url", "image_url": {"url": f"data:{media};base64,{data}"}}
    if (
        isinstance(source, dict)
        and source.get("type") == "url"
        and isinstance(source.get("url"), str)
    ):
        return {"type": "image_url", "image_url": {"url": source["url"]}}
    raise bad_request(f"'{at}.source' must be a base64 or url image source", param=at)


def _tool_use(block: dict[str, Any], at: str) -> dict[str, Any]:
    call_id, name, args = block.get("id"), block.get("name"), block.get("input", {})
    if not isinstance(call_id, str) or not isinstance(name, str) or not isinstance(args, dict):
        raise bad_request(
            f"'{at}': a tool_use block needs a string 'id' and 'name' and an object 'input'",
            param=at,
        )
    try:  # orjson reads 1,024 levels of nesting but writes 254
        arguments = orjson.dumps(args).decode()
    except orjson.JSONEncodeError as e:
        raise bad_request(f"'{at}.input' cannot be forwarded: {e}", param=at) from e
    return {"id": call_id, "type": "function", "function": {"name": name, "arguments": arguments}}


def _tool_result(block: dict[str, Any], at: str) -> dict[str, Any]:
    call_id = block.get("tool_use_id")
    if not isinstance(call_id, str):
        raise bad_request(f"'{at}.tool_use_id' must be a string", param=at)
    content = block.get("content", "")
    if isinstance(content, list):
        texts = []
        for k, inner in enumerate(content):
            if _block_type(inner, f"{at}.content[{k}]") != "text":
                raise bad_request(
                    f"'{at}.content[{k}]': only text is supported in a tool result", param=at
                )
            texts.append(_text(inner, f"{at}.content[{k}]"))
        content = "\n".join(texts)
    elif not isinstance(content, str):
        raise bad_request(f"'{at}.content' must be a string or text blocks", param=at)
    if block.get("is_error") is True:
        # OpenAI's tool message has no error flag: the model is told in words.
        content = f"Error: {content}"
    return {"role": "tool", "tool_call_id": call_id, "content": content}


def _tools(tools: Any) -> list[dict[str, Any]]:
    if tools is None:
        return []
    if not isinstance(tools, list):
        raise bad_request("'tools' must be an array", param="tools")
    out = []
    for i, tool in enumerate(tools):
        at = f"tools[{i}]"
        if not isinstance(tool, dict) or not isinstance(tool.get("name"), str):
            raise bad_request(f"'{at}' must be an object with a string 'name'", param=at)
        if tool.get("type", "custom") != "custom" or "input_schema" not in tool:
            raise bad_request(
                f"'{at}': only custom tools with an 'input_schema' are "
                f"supported (not '{tool.get('type')}')",
                param=at,
            )
        schema = tool["input_schema"]
        if not isinstance(schema, dict):
            raise bad_request(f"'{at}.input_schema' must be an object", param=at)
        function: dict[str, Any] = {"name": tool["name"], "parameters": schema}
        if isinstance(tool.get("description"), str):
            function["description"] = tool["description"]
        out.append({"type": "function", "function": function})
    return out


def _tool_choice(choice: Any) -> dict[str, Any]:
    if choice is None:
        return {}
    if not isinstance(choice, dict):
        raise bad_request("'tool_choice' must be an object", param="tool_choice")
    kind = choice.get("type")
    out: dict[str, Any]
    if kind == "auto":
        out = {"tool_choice": "auto"}
    elif kind == "any":
        out = {"tool_choice": "required"}
    elif kind == "none":
        out = {"tool_choice": "none"}
    elif kind == "tool" and isinstance(choice.get("name"), str):
        out = {"tool_choice": {"type": "function", "function": {"name": choice["name"]}}}
    else:
        raise bad_request(
            "'tool_choice.type' must be auto, any, tool (with a 'name') or none",
            param="tool_choice",
        )
    if choice.get("disable_parallel_tool_use") is True:
        out["parallel_tool_calls"] = False
    return out


def _stop_sequences(value: Any) -> tuple[str, ...]:
    if value is None:
        return ()
    if (
        not isinstance(value, list)
        or len(value) > MAX_STOP_SEQUENCES
        or not all(isinstance(s, str) and s for s in value)
    ):
        raise bad_request(
            f"'stop_sequences' must be an array of up to {MAX_STOP_SEQUENCES} non-empty strings",
            param="stop_sequences",
        )
    return tuple(value)
