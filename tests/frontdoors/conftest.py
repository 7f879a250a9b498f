"""OpenAI answers with tool calls, as real backends send them, for the fake upstreams."""

from __future__ import annotations

import orjson

from tests.fakes.upstream import Behaviour

TOOL_ARGS = {"city": "Paris", "days": 2}


def tool_call_body(model: str = "fake-model") -> Behaviour:
    answer = {
        "id": "chatcmpl-tool1",
        "object": "chat.completion",
        "created": 0,
        "model": model,
        "choices": [
            {
                "index": 0,
                "finish_reason": "tool_calls",
                "message": {
                    "role": "assistant",
                    "content": None,
                    "tool_calls": [
                        {
                            "id": "call_abc",
                            "type": "function",
                            "function": {
                                "name": "get_weather",
                                "arguments": orjson.dumps(TOOL_ARGS).decode(),
                            },
                        }
                    ],
                },
            }
        ],
        "usage": {"prompt_tokens": 20, "completion_tokens": 9, "total_tokens": 29},
    }
    return Behaviour(raw_body=orjson.dumps(answer))


def tool_call_stream(model: str = "fake-model") -> Behaviour:
    """llama.cpp / vLLM style: the call's id and name first, its arguments in pieces."""
    args = orjson.dumps(TOOL_ARGS).decode()
    base = {"id": "chatcmpl-tool2", "object": "chat.completion.chunk", "created": 0, "model": model}

    def chunk(delta: dict, finish: str | None = None, **extra: object) -> bytes:
        choices = [] if delta is None else [{"index": 0, "delta": delta, "finish_reason": finish}]
        return b"data: " + orjson.dumps({**base, "choices": choices, **extra}) + b"\n\n"

    events = [
        chunk({"role": "assistant", "content": ""}),
        chunk({"content": "Let me check."}),
        chunk(
            {
                "tool_calls": [
                    {
                        "index": 0,
                        "id": "call_xyz",
                        "type": "function",
                        "function": {"name": "get_weather", "arguments": ""},
                    }
                ]
            }
        ),
    ]
    for i in range(0, len(args), 7):
        events.append(
            chunk({"tool_calls": [{"index": 0, "function": {"arguments": args[i : i + 7]}}]})
        )
    events.append(chunk({}, "tool_calls"))
    events.append(
        b"data: "
        + orjson.dumps(
            {
                **base,
                "choices": [],
                "usage": {"prompt_tokens": 21, "completion_tokens": 11, "total_tokens": 32},
            }
        )
        + b"\n\n"
    )
    events.append(b"data: [DONE]\n\n")
    return Behaviour(raw_body=b"".join(events))
