"""The front doors' pure translators, without I/O: requests in, answers and events out."""

from __future__ import annotations

import itertools

import orjson
import pytest

from router.frontdoors import anthropic_in, ollama_in
from router.frontdoors.anthropic_out import AnthropicEgress, message_body, stop_reason
from router.frontdoors.ollama_out import OllamaEgress
from router.kernel import errors
from router.kernel.errors import RouterError
from router.proxy import doorerrors


def sse(*events: dict) -> bytes:
    return b"".join(b"data: " + orjson.dumps(e) + b"\n\n" for e in events) + b"data: [DONE]\n\n"


def chunk(delta: dict | None = None, finish: str | None = None, **extra: object) -> dict:
    choices = [] if delta is None else [{"index": 0, "delta": delta, "finish_reason": finish}]
    return {"id": "chatcmpl-1", "choices": choices, **extra}


def anthropic_events(data: bytes) -> list[tuple[str, dict]]:
    out = []
    for block in data.decode().split("\n\n"):
        if block:
            name, payload = block.split("\n", 1)
            out.append((name.removeprefix("event: "), orjson.loads(payload.removeprefix("data: "))))
    return out


# --- Anthropic in ---------------------------------------------------------------------------


def test_anthropic_request_maps_every_field() -> None:
    req = anthropic_in.to_openai(
        {
            "model": "m",
            "max_tokens": 10,
            "system": "sys",
            "stop_sequences": ["X"],
            "temperature": 0.1,
            "top_p": 0.9,
            "top_k": 3,
            "metadata": {"user_id": "u1"},
            "stream": True,
            "tool_choice": {"type": "tool", "name": "f", "disable_parallel_tool_use": True},
            "tools": [{"name": "f", "input_schema": {"type": "object"}, "cache_control": {}}],
            "messages": [
                {
                    "role": "user",
                    "content": [
                        {"type": "text", "text": "a", "cache_control": {"type": "ephemeral"}},
                        {"type": "text", "text": "b"},
                    ],
                },
                {
                    "role": "assistant",
                    "content": [
                        {"type": "thinking", "thinking": "hm", "signature": "s"},
                        {"type": "text", "text": "calling"},
                        {"type": "tool_use", "id": "t1", "name": "f", "input": {"x": 1}},
                    ],
                },
                {
                    "role": "user",
                    "content": [
                        {"type": "text", "text": "after"},
                        {
                            "type": "tool_result",
                            "tool_use_id": "t1",
                            "is_error": True,
                            "content": [{"type": "text", "text": "boom"}],
                        },
                    ],
                },
            ],
        }
    )
    o = req.openai
    assert (req.model, req.stream, req.stop_sequences) == ("m", True, ("X",))
    assert o["messages"] == [
        {"role": "system", "content": "sys"},
        {"role": "user", "content": "a\nb"},
        {
            "role": "assistant",
            "content": "calling",
            "tool_calls": [
                {"id": "t1", "type": "function", "function": {"name": "f", "arguments": '{"x":1}'}}
            ],
        },
        {"role": "tool", "tool_call_id": "t1", "content": "Error: boom"},
        {"role": "user", "content": "after"},
    ]
    assert o["tools"] == [
        {"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}
    ]
    assert o["tool_choice"] == {"type": "function", "function": {"name": "f"}}
    assert o["parallel_tool_calls"] is False
    assert (o["stop"], o["temperature"], o["top_p"], o["top_k"], o["user"], o["max_tokens"]) == (
        ["X"],
        0.1,
        0.9,
        3,
        "u1",
        10,
    )
    assert o["stream_options"] == {"include_usage": True, "continuous_usage_stats": True}


@pytest.mark.parametrize(
    "body, param",
    [
        ({"model": "m", "messages": [{"role": "user", "content": "x"}]}, "max_tokens"),
        (
            {"model": "m", "max_tokens": 0, "messages": [{"role": "user", "content": "x"}]},
            "max_tokens",
        ),
        ({"model": "m", "max_tokens": 5, "messages": []}, "messages"),
        (
            {"model": "m", "max_tokens": 5, "messages": [{"role": "robot", "content": "x"}]},
            "messages[0]",
        ),
        (
            {"model": "m", "max_tokens": 5, "messages": [{"role": "user", "content": 3}]},
            "messages[0]",
        ),
        (
            {
                "model": "m",
                "max_tokens": 5,
                "tools": [{"type": "web_search_20250305", "name": "w"}],
                "messages": [{"role": "user", "content": "x"}],
            },
            "tools[0]",
        ),
        (
            {
                "model": "m",
                "max_tokens": 5,
                "stop_sequences": "X",
                "messages": [{"role": "user", "content": "x"}],
            },
            "stop_sequences",
        ),
    ],
)
def test_anthropic_request_refusals_name_the_field(body: dict, param: str) -> None:
    with pytest.raises(RouterError) as refused:
        anthropic_in.to_openai(body)
    assert refused.value.status == 400 and refused.value.param == param


def test_count_tokens_needs_no_max_tokens() -> None:
    req = anthropic_in.to_openai(
        {"model": "m", "messages": [{"role": "user", "content": "x"}]}, for_count=True
    )
    assert "max_tokens" not in req.openai


# --- Anthropic out --------------------------------------------------------------------------


@pytest.mark.parametrize(
    "finish, matched, tools, expected",
    [
        ("stop", None, False, ("end_turn", None)),
        ("length", None, False, ("max_tokens", None)),
        ("stop", "END", False, ("stop_sequence", "END")),
        ("stop", "OTHER", False, ("end_turn", None)),
        ("tool_calls", None, True, ("tool_use", None)),
        ("stop", None, True, ("tool_use", None)),
    ],
)
def test_stop_reasons(
    finish: str, matched: str | None, tools: bool, expected: tuple[str, str | None]
) -> None:
    assert stop_reason(finish, matched, ("END",), tools) == expected


def test_whole_answer_with_text_and_a_tool_call() -> None:
    body = message_body(
        {
            "id": "chatcmpl-9",
            "choices": [
                {
                    "finish_reason": "tool_calls",
                    "message": {
                        "content": "ok",
                        "tool_calls": [
                            {"id": "c1", "function": {"name": "f", "arguments": '{"a": [1]}'}}
                        ],
                    },
                }
            ],
            "usage": {"prompt_tokens": 4, "completion_tokens": 2},
        },
        "m",
        (),
    )
    assert body["id"] == "msg_9" and body["stop_reason"] == "tool_use"
    assert body["content"] == [
        {"type": "text", "text": "ok"},
        {"type": "tool_use", "id": "c1", "name": "f", "input": {"a": [1]}},
    ]
    assert body["usage"] == {"input_tokens": 4, "output_tokens": 2}


def test_whole_answer_with_broken_tool_arguments_is_a_clear_502() -> None:
    with pytest.raises(RouterError) as failed:
        message_body(
            {
                "choices": [
                    {
                        "finish_reason": "tool_calls",
                        "message": {
                            "tool_calls": [
                                {"id": "c", "function": {"name": "f", "arguments": "{oops"}}
                            ]
                        },
                    }
                ]
            },
            "m",
            (),
        )
    assert failed.value.status == 502 and failed.value.code == "upstream_bad_tool_call"


def test_stream_event_sequence_with_text_then_tool_and_a_stop_sequence_split_anywhere() -> None:
    data = sse(
        chunk({"role": "assistant", "content": ""}),
        chunk({"content": "Hi"}),
        chunk({"content": " there"}),
        chunk(
            {
                "tool_calls": [
                    {"index": 0, "id": "c1", "function": {"name": "f", "arguments": '{"a"'}}
                ]
            }
        ),
        chunk({"tool_calls": [{"index": 0, "function": {"arguments": ":1}"}}]}),
        chunk(
            {},
            "stop",
        ),
        chunk(usage={"prompt_tokens": 3, "completion_tokens": 4}),
    )
    whole = AnthropicEgress("m", ("END",))
    expected = whole.events(data) + whole.finish()
    # The relay hands over whole events, in any grouping: the output does not depend on it.
    events = data.split(b"\n\n")[:-1]
    for cut in (1, 3, 5):
        egress = AnthropicEgress("m", ("END",))
        out = (
            b"".join(egress.events(b"\n\n".join(g) + b"\n\n") for g in (events[:cut], events[cut:]))
            + egress.finish()
        )
        assert [n for n, _ in anthropic_events(out)] == [n for n, _ in anthropic_events(expected)]
    seq = anthropic_events(expected)
    assert [n for n, _ in seq] == [
        "message_start",
        "ping",
        "content_block_start",
        "content_block_delta",
        "content_block_delta",
        "content_block_stop",
        "content_block_start",
        "content_block_delta",
        "content_block_delta",
        "content_block_stop",
        "message_delta",
        "message_stop",
    ]
    assert seq[6][1]["content_block"] == {"type": "tool_use", "id": "c1", "name": "f", "input": {}}
    assert seq[7][1]["delta"] == {"type": "input_json_delta", "partial_json": '{"a"'}
    assert seq[10][1]["delta"]["stop_reason"] == "tool_use"
    assert seq[10][1]["usage"] == {"input_tokens": 3, "output_tokens": 4}


def test_stream_stop_sequence_reported_by_the_backend() -> None:
    egress = AnthropicEgress("m", ("END",))
    out = egress.events(
        sse(
            chunk({"content": "a"}),
            {"choices": [{"index": 0, "delta": {}, "finish_reason": "stop", "stop_reason": "END"}]},
        )
    )
    delta = anthropic_events(out + egress.finish())[-2][1]["delta"]
    assert delta == {"stop_reason": "stop_sequence", "stop_sequence": "END"}


def test_stream_errors_end_it_once() -> None:
    egress = AnthropicEgress("m")
    egress.events(sse(chunk({"content": "a"})))
    out = egress.events(b'data: {"error": {"message": "overloaded", "code": 503}}\n\n')
    assert anthropic_events(out)[0] == (
        "error",
        {"type": "error", "error": {"type": "overloaded_error", "message": "[503] overloaded"}},
    )
    assert egress.finish() == b"" and egress.error(errors.upstream_failed("x")) == b""


# --- Ollama ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("value", "seconds"),
    [
        (None, None),
        (0, 0.0),
        ("0", 0.0),
        (300, 300.0),
        (2.5, 2.5),
        ("30s", 30.0),
        ("5m", 300.0),
        ("1h30m", 5400.0),
        ("1.5h", 5400.0),
        ("250ms", 0.25),
        ("-1", -1.0),
        (-5, -1.0),
        ("-1m", -1.0),
        ("10000000h", ollama_in.MAX_KEEP_ALIVE),
    ],
)
def test_ollama_keep_alive_durations(value: object, seconds: float | None) -> None:
    assert ollama_in.keep_alive_seconds(value) == seconds


@pytest.mark.parametrize(
    "value",
    [
        *(True, "", "5 minutes", "m", "5x", "1h 30m", [], {}, "nan"),
        # ASCII digits only (float() and \d take these; Go's ParseDuration does not):
        # Arabic-Indic, fullwidth, superscript, underscores, exponents, infinities
        *("\u0663", "\u0663s", "\uff15m", "\u00b2", "1_0", "1e3", "inf", "-inf", "infinity"),
    ],
)
def test_ollama_keep_alive_malformed_is_a_400(value: object) -> None:
    with pytest.raises(RouterError) as caught:
        ollama_in.keep_alive_seconds(value)
    assert (caught.value.status, caught.value.param) == (400, "keep_alive")


def test_ollama_requests_carry_their_keep_alive() -> None:
    chat = ollama_in.chat_to_openai(
        {"model": "m", "keep_alive": "5m", "messages": [{"role": "user", "content": "q"}]}
    )
    assert chat.keep_alive == 300.0 and "keep_alive" not in chat.openai
    assert ollama_in.generate_to_openai({"model": "m", "prompt": "p"}).keep_alive is None


def test_ollama_chat_request_maps_options_format_and_tool_ids() -> None:
    req = ollama_in.chat_to_openai(
        {
            "model": "m",
            "format": "json",
            "keep_alive": -1,
            "think": False,
            "options": {"num_predict": -1, "num_ctx": 8192, "repeat_penalty": 1.1, "mirostat": 1},
            "tools": [{"type": "function", "function": {"name": "f"}}],
            "messages": [
                {"role": "user", "content": "q", "images": ["/9j/AAAA"]},
                {
                    "role": "assistant",
                    "content": "",
                    "tool_calls": [
                        {"function": {"name": "f", "arguments": {"a": 1}}},
                        {"function": {"name": "g", "arguments": {}}},
                    ],
                },
                {"role": "tool", "tool_name": "g", "content": "G"},
                {"role": "tool", "content": "F"},
            ],
        }
    )
    o = req.openai
    assert req.stream and o["stream"] and req.endpoint == "chat"
    assert "max_tokens" not in o and o["repetition_penalty"] == 1.1
    assert o["response_format"] == {"type": "json_object"}
    assert o["messages"][0]["content"][1]["image_url"]["url"].startswith("data:image/jpeg")
    ids = [c["id"] for c in o["messages"][1]["tool_calls"]]
    assert o["messages"][2]["tool_call_id"] == ids[1]  # named: g's call
    assert o["messages"][3]["tool_call_id"] == ids[0]  # unnamed: the oldest open call


@pytest.mark.parametrize(
    "body, param",
    [
        ({"model": "m", "messages": [{"role": "user", "content": "x"}], "format": "xml"}, "format"),
        (
            {
                "model": "m",
                "messages": [{"role": "user", "content": "x"}],
                "options": {"temperature": "hot"},
            },
            "options.temperature",
        ),
        ({"model": "m", "messages": [{"role": "robot", "content": "x"}]}, "messages[0]"),
        ({"messages": [{"role": "user", "content": "x"}]}, "model"),
    ],
)
def test_ollama_refusals_name_the_field(body: dict, param: str) -> None:
    with pytest.raises(RouterError) as refused:
        ollama_in.chat_to_openai(body)
    assert refused.value.status == 400 and refused.value.param == param


def fake_clock(*readings: float):  # type: ignore[no-untyped-def]
    values = itertools.chain(readings, itertools.repeat(readings[-1]))
    return lambda: next(values)


def test_ollama_stream_lines_counts_and_nanosecond_durations() -> None:
    egress = OllamaEgress(
        "chat", "m", arrival=10.0, clock=fake_clock(10.5, 12.0), stamp=lambda: "T"
    )
    out = egress.events(
        sse(
            chunk({"content": "Hi"}),
            chunk({}, "length"),
            chunk(usage={"prompt_tokens": 3, "completion_tokens": 4}),
        )
    )
    out += egress.finish()
    lines = [orjson.loads(x) for x in out.splitlines()]
    assert lines[0] == {
        "model": "m",
        "created_at": "T",
        "done": False,
        "message": {"role": "assistant", "content": "Hi"},
    }
    assert lines[1] == {
        "model": "m",
        "created_at": "T",
        "message": {"role": "assistant", "content": ""},
        "done": True,
        "done_reason": "length",
        "total_duration": 2_000_000_000,
        "load_duration": 0,
        "prompt_eval_count": 3,
        "prompt_eval_duration": 500_000_000,
        "eval_count": 4,
        "eval_duration": 1_500_000_000,
    }


def test_ollama_stream_tool_calls_are_sent_whole() -> None:
    egress = OllamaEgress("chat", "m", arrival=0.0, clock=fake_clock(1.0), stamp=lambda: "T")
    out = (
        egress.events(
            sse(
                chunk(
                    {
                        "tool_calls": [
                            {"index": 0, "id": "c", "function": {"name": "f", "arguments": '{"a":'}}
                        ]
                    }
                ),
                chunk({"tool_calls": [{"index": 0, "function": {"arguments": " 2}"}}]}),
                chunk({}, "tool_calls"),
            )
        )
        + egress.finish()
    )
    lines = [orjson.loads(x) for x in out.splitlines()]
    assert lines[0]["message"]["tool_calls"] == [{"function": {"name": "f", "arguments": {"a": 2}}}]
    assert lines[1]["done"] and lines[1]["done_reason"] == "stop"


def test_ollama_stream_drops_a_tool_call_cut_by_the_token_limit() -> None:
    egress = OllamaEgress("chat", "m", arrival=0.0, clock=fake_clock(1.0), stamp=lambda: "T")
    out = (
        egress.events(
            sse(
                chunk(
                    {
                        "tool_calls": [
                            {"index": 0, "id": "c", "function": {"name": "f", "arguments": '{"a":'}}
                        ]
                    }
                ),
                chunk({"tool_calls": [{"index": 0, "function": {"arguments": ' "b'}}]}),
                chunk(
                    {
                        "tool_calls": [
                            {"index": 1, "id": "d", "function": {"name": "g", "arguments": "{}"}}
                        ]
                    }
                ),
                chunk(
                    {
                        "tool_calls": [
                            {"index": 2, "id": "e", "function": {"name": "h", "arguments": '{"x'}}
                        ]
                    }
                ),
                chunk({}, "length"),
            )
        )
        + egress.finish()
    )
    lines = [orjson.loads(x) for x in out.splitlines()]
    # The whole call is sent; the cut ones are dropped, not an error.
    assert lines[0]["message"]["tool_calls"] == [{"function": {"name": "g", "arguments": {}}}]
    lines = lines[1:]
    assert len(lines) == 1 and "error" not in lines[0]
    assert lines[0]["done"] and lines[0]["done_reason"] == "length"
    assert "tool_calls" not in lines[0]["message"]


def test_ollama_generate_and_errors() -> None:
    egress = OllamaEgress("generate", "m", arrival=0.0, clock=fake_clock(1.0), stamp=lambda: "T")
    out = egress.events(
        b'data: {"choices": [{"index": 0, "text": "x", "finish_reason": null}]}\n\n'
    )
    assert orjson.loads(out)["response"] == "x"
    err = egress.error(errors.upstream_timeout("slow"))
    assert orjson.loads(err) == {"error": "[upstream_timeout] slow"}
    assert egress.finish() == b""


# --- doorerrors.py per API ------------------------------------------------------------------


@pytest.mark.parametrize(
    "status, anthropic_status, kind",
    [
        (400, 400, "invalid_request_error"),
        (401, 401, "authentication_error"),
        (403, 403, "permission_error"),
        (404, 404, "not_found_error"),
        (413, 413, "request_too_large"),
        (429, 429, "rate_limit_error"),
        (502, 500, "api_error"),
        (503, 529, "overloaded_error"),
        (504, 504, "timeout_error"),
    ],
)
def test_errors_render_per_api(status: int, anthropic_status: int, kind: str) -> None:
    err = RouterError(status, "nope", code="why")
    got_status, body, headers = doorerrors.render(err, "anthropic")
    assert (got_status, orjson.loads(body)) == (
        anthropic_status,
        {"type": "error", "error": {"type": kind, "message": "[why] nope"}},
    )
    assert headers["X-Speclane-Error-Source"] == "router"
    got_status, body, _ = doorerrors.render(err, "ollama")
    assert (got_status, orjson.loads(body)) == (status, {"error": "[why] nope"})
    assert orjson.loads(doorerrors.render(err)[1])["error"]["code"] == "why"


def test_api_for_path() -> None:
    assert doorerrors.api_for_path("/v1/messages") == "anthropic"
    assert doorerrors.api_for_path("/v1/messages/count_tokens") == "anthropic"
    assert doorerrors.api_for_path("/api/chat") == "ollama"
    assert doorerrors.api_for_path("/v1/chat/completions") == "openai"


CUT_ANSWER = {
    "choices": [
        {
            "finish_reason": "length",
            "message": {
                "content": "Checking.",
                "tool_calls": [  # OpenAI's (and the lanes') call cut by the token limit
                    {"id": "c", "function": {"name": "f", "arguments": '{"a": "par'}}
                ],
            },
        }
    ],
    "usage": {"prompt_tokens": 4, "completion_tokens": 8},
}


def test_a_whole_answer_cut_inside_a_call_drops_that_call_not_the_answer() -> None:
    """Anthropic's ``input`` and Ollama's ``arguments`` are objects: a call the token limit
    cut cannot be one, so it is dropped (as their streams drop it), never a 502."""
    body = message_body(CUT_ANSWER, "m", ())
    assert body["stop_reason"] == "max_tokens"
    assert body["content"] == [{"type": "text", "text": "Checking."}]
    egress = OllamaEgress("chat", "m", arrival=0.0, clock=fake_clock(1.0), stamp=lambda: "T")
    answer = orjson.loads(egress.body(CUT_ANSWER))
    assert answer["done_reason"] == "length" and "tool_calls" not in answer["message"]
    assert answer["message"]["content"] == "Checking."


def _entry(token: str, logprob: float) -> dict:
    alternative = {"token": token, "logprob": logprob, "bytes": list(token.encode())}
    return {**alternative, "top_logprobs": [alternative]}


def test_ollama_logprobs_map_both_ways() -> None:
    chat = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "logprobs": True}
    assert ollama_in.chat_to_openai({**chat, "top_logprobs": 3}).openai["top_logprobs"] == 3
    assert ollama_in.chat_to_openai(chat).openai["logprobs"] is True
    assert "logprobs" not in ollama_in.chat_to_openai({**chat, "logprobs": False}).openai
    raw = {"model": "m", "prompt": "x", "raw": True, "logprobs": True, "top_logprobs": 9}
    assert ollama_in.generate_to_openai(raw).openai["logprobs"] == 5  # completions' limit
    with pytest.raises(RouterError) as refused:
        ollama_in.chat_to_openai({**chat, "top_logprobs": 21})
    assert refused.value.param == "top_logprobs"

    whole = OllamaEgress("chat", "m", arrival=0.0, clock=fake_clock(1.0), stamp=lambda: "T")
    answer = {
        "choices": [
            {
                "finish_reason": "stop",
                "message": {"content": "ab"},
                "logprobs": {"content": [_entry("a", -0.1), _entry("b", -0.2)]},
            }
        ]
    }
    line = orjson.loads(whole.body(answer))
    assert [e["token"] for e in line["logprobs"]] == ["a", "b"]
    generate = OllamaEgress("generate", "m", arrival=0.0, clock=fake_clock(1.0), stamp=lambda: "T")
    completion = {
        "choices": [
            {
                "finish_reason": "stop",
                "text": "ab",
                "logprobs": {
                    "tokens": ["a", "b"],
                    "token_logprobs": [-0.1, -0.2],
                    "top_logprobs": [{"a": -0.1}, {"b": -0.2}],
                    "text_offset": [0, 1],
                },
            }
        ]
    }
    line = orjson.loads(generate.body(completion))
    assert line["logprobs"] == [_entry("a", -0.1), _entry("b", -0.2)]

    streamed = OllamaEgress("chat", "m", arrival=0.0, clock=fake_clock(1.0), stamp=lambda: "T")
    first = chunk({"content": "a"})
    first["choices"][0]["logprobs"] = {"content": [_entry("a", -0.1)]}
    last = chunk({}, "stop")
    last["choices"][0]["logprobs"] = {"content": [_entry("b", -0.2)]}  # no text of its own
    lines = [
        orjson.loads(x)
        for x in (streamed.events(sse(first, last)) + streamed.finish()).splitlines()
    ]
    assert [[e["token"] for e in x.get("logprobs", [])] for x in lines] == [["a"], ["b"]]
