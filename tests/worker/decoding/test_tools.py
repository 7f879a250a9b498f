"""Tool calls into the prompt and out of the answer (pure: no model, real mlx-lm parsers)."""

from __future__ import annotations

import json
from typing import Any

import pytest

from router.worker.decoding.tools import (
    ParsedCall,
    ToolStream,
    fallback_messages,
    fallback_syntax,
    format_call,
)
from router.worker.request.protocol import Tool, parse_generation_request

WEATHER = Tool("get_weather", "Weather in a city", '{"type":"object"}')
TIME = Tool("get_time", None, '{"type":"object"}')
CALL = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'


def stream(**kw: Any) -> ToolStream:
    return ToolStream(fallback_syntax(), (WEATHER, TIME), **kw)


def run(text: str, step: int, **kw: Any) -> tuple[str, list[ParsedCall]]:
    """Feed ``text`` in pieces of ``step`` characters; the content and the calls that come out."""
    s = stream(**kw)
    pieces = [p for i in range(0, len(text), step) for p in s.feed(text[i : i + step])]
    pieces += s.finish()
    content = "".join(p for p in pieces if isinstance(p, str))
    return content, [p for p in pieces if isinstance(p, ParsedCall)]


@pytest.mark.parametrize("step", [1, 3, 7, 1000])
def test_a_call_is_parsed_whatever_the_chunking(step: int) -> None:
    content, calls = run("Let me look.\n" + CALL + "\n", step)
    assert content == "Let me look."  # the newline before the call is not content
    assert [(c.index, c.name, json.loads(c.arguments)) for c in calls] == [
        (0, "get_weather", {"city": "Paris"})
    ]
    assert calls[0].id.startswith("call_")


def test_parallel_calls_get_indexes_and_distinct_ids() -> None:
    second = CALL.replace("get_weather", "get_time").replace('"Paris"', '"Rome"')
    content, calls = run(CALL + "\n" + second, 5)
    assert content == ""  # the newline between calls is not content
    assert [(c.index, c.name) for c in calls] == [(0, "get_weather"), (1, "get_time")]
    assert calls[0].id != calls[1].id


def test_parallel_false_keeps_the_first_call() -> None:
    _, calls = run(CALL + "\n" + CALL, 4, parallel=False)
    assert len(calls) == 1


@pytest.mark.parametrize(
    "broken",
    [
        "<tool_call>\n{not json}\n</tool_call>",  # does not parse: given back as text
        '<tool_call>\n{"name": "get_weather", "argu',  # cut by max_tokens: no end marker
    ],
)
def test_a_call_that_does_not_parse_comes_back_as_content(broken: str) -> None:
    content, calls = run("x " + broken, 3)
    assert calls == []
    assert content == "x " + broken


def test_text_that_only_looks_like_a_marker_is_content() -> None:
    content, calls = run("a <tool_cal b <tool", 2)
    assert (content, calls) == ("a <tool_cal b <tool", [])


def test_a_blank_answer_is_kept_when_there_is_no_call() -> None:
    assert run("\n\n", 1) == ("\n\n", [])


def test_arguments_stream_after_id_and_name_in_fragments() -> None:
    arguments = json.dumps({"path": "a" * 100})
    deltas = ParsedCall(2, "call_x", "read", arguments).stream_deltas()
    assert deltas[0] == {
        "index": 2,
        "id": "call_x",
        "type": "function",
        "function": {"name": "read", "arguments": ""},
    }
    assert len(deltas) > 2
    assert all(set(d) == {"index", "function"} and d["index"] == 2 for d in deltas[1:])
    assert "".join(d["function"]["arguments"] for d in deltas[1:]) == arguments


def _request(**fields: Any) -> Any:
    tools = [
        {"type": "function", "function": {"name": t.name, "parameters": {"type": "object"}}}
        for t in (WEATHER, TIME)
    ]
    return parse_generation_request({"messages": CONVERSATION, "tools": tools, **fields}, "chat")


CONVERSATION: list[dict[str, Any]] = [
    {"role": "system", "content": "Be brief."},
    {"role": "user", "content": "Weather and time in Paris?"},
    {
        "role": "assistant",
        "content": None,
        "tool_calls": [
            {
                "id": "c1",
                "type": "function",
                "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'},
            },
            {
                "id": "c2",
                "type": "function",
                "function": {"name": "get_time", "arguments": '{"city": "Paris"}'},
            },
        ],
    },
    {"role": "tool", "tool_call_id": "c1", "content": "sunny"},
    {"role": "tool", "tool_call_id": "c2", "content": "noon"},
]


def test_fallback_puts_tools_in_the_system_message_and_replays_history() -> None:
    messages = fallback_messages(_request())
    assert [m["role"] for m in messages] == ["system", "user", "assistant", "user"]
    system = messages[0]["content"]
    assert system.startswith("Be brief.\n\n# Tools")
    assert '"name": "get_weather"' in system and '"name": "get_time"' in system
    assert "<tool_call>" in system
    # Earlier calls are written the way the model is asked to write them ...
    assert messages[2]["content"] == "\n".join(
        [format_call("get_weather", {"city": "Paris"}), format_call("get_time", {"city": "Paris"})]
    )
    # ... and the results of one round share one user turn.
    assert messages[3]["content"] == (
        "<tool_response>\nsunny\n</tool_response>\n<tool_response>\nnoon\n</tool_response>"
    )


def test_the_fallback_convention_reads_back_with_the_same_parser() -> None:
    _, calls = run(format_call("get_time", {"tz": "Europe/Paris"}), 2)
    assert [(c.name, json.loads(c.arguments)) for c in calls] == [
        ("get_time", {"tz": "Europe/Paris"})
    ]


@pytest.mark.parametrize(
    ("fields", "says"),
    [
        ({"tool_choice": "required"}, "Call at least one function now."),
        (
            {"tool_choice": {"type": "function", "function": {"name": "get_time"}}},
            "Call the function get_time now.",
        ),
        ({"tool_choice": "none"}, "Do not call a function now"),
        ({"parallel_tool_calls": False}, "Call at most one function."),
    ],
)
def test_fallback_tells_the_model_the_tool_choice(fields: dict[str, Any], says: str) -> None:
    assert says in fallback_messages(_request(**fields))[0]["content"]


def test_without_a_system_message_one_is_added() -> None:
    request = _request(messages=[{"role": "user", "content": "hi"}])
    messages = fallback_messages(request)
    assert [m["role"] for m in messages] == ["system", "user"]
    assert messages[0]["content"].startswith("# Tools")


# A Qwen2.5-style template (what mlx-lm recognises as json_tools), on the default tokenizer.
NATIVE_TEMPLATE = (
    "{%- if tools %}<|im_start|>system\n# Tools\n<tools>"
    "{%- for tool in tools %}\n{{ tool | tojson }}{%- endfor %}\n</tools><|im_end|>\n{%- endif %}"
    "{%- for message in messages %}"
    "{%- if message.role == 'assistant' and message.tool_calls %}<|im_start|>assistant"
    "{%- for tool_call in message.tool_calls %}"
    "{%- if tool_call.function is defined %}{%- set tool_call = tool_call.function %}{%- endif %}"
    '\n<tool_call>\n{"name": "{{ tool_call.name }}", "arguments": '
    "{{ tool_call.arguments | tojson }}}\n</tool_call>{%- endfor %}<|im_end|>\n"
    "{%- elif message.role == 'tool' %}<|im_start|>user\n<tool_response>\n{{ message.content }}"
    "\n</tool_response><|im_end|>\n"
    "{%- else %}<|im_start|>{{ message.role }}\n{{ message.content }}<|im_end|>\n{%- endif %}"
    "{%- endfor %}{%- if add_generation_prompt %}<|im_start|>assistant\n{%- endif %}"
)


@pytest.fixture(scope="module")
def native_tokenizer(prepared_models: tuple[Any, Any]) -> Any:
    from mlx_lm.tokenizer_utils import load

    return load(prepared_models[0], tokenizer_config_extra={"chat_template": NATIVE_TEMPLATE})


def test_a_template_with_tools_gets_them_natively(native_tokenizer: Any) -> None:
    from router.worker.decoding.tools import syntax_for
    from router.worker.http.server import encode

    request = _request()
    syntax = syntax_for(native_tokenizer, request)
    assert syntax.native and syntax.start == "<tool_call>"
    prompt = native_tokenizer.decode(encode(native_tokenizer, request, syntax))
    assert "<tools>" in prompt and '"name": "get_time"' in prompt
    assert '"arguments": {"city": "Paris"}' in prompt  # history: arguments as an object
    assert "<tool_response>\nnoon\n</tool_response>" in prompt
    assert "# Tools\n\nYou may call" not in prompt  # not the fallback text
    s = ToolStream(syntax, request.tools)
    calls = [p for p in s.feed(CALL) + s.finish() if isinstance(p, ParsedCall)]
    assert [c.name for c in calls] == ["get_weather"]


def test_the_default_template_gets_the_fallback(prepared_models: tuple[Any, Any]) -> None:
    from mlx_lm.tokenizer_utils import load

    from router.worker.decoding.tools import syntax_for
    from router.worker.http.server import encode

    tokenizer = load(prepared_models[0])
    request = _request()
    syntax = syntax_for(tokenizer, request)
    assert not syntax.native
    with_tools = encode(tokenizer, request, syntax)
    without = encode(
        tokenizer, parse_generation_request({"messages": CONVERSATION}, "chat"), syntax
    )
    assert len(with_tools) > len(without)  # the tools are in the prompt, not dropped
    assert '"name": "get_weather"' in tokenizer.decode(with_tools)


# An LFM2-style template: mlx-lm reads its calls with the pythonic parser.
PYTHONIC_TEMPLATE = (
    "{%- if tools %}<|im_start|>system\nList of tools: <|tool_list_start|>{{ tools | tojson }}"
    "<|tool_list_end|><|im_end|>\n{%- endif %}"
    "{%- for message in messages %}<|im_start|>{{ message.role }}\n"
    "{%- if message.tool_calls %}<|tool_call_start|>["
    "{%- for c in message.tool_calls %}{{ c.function.name }}(){%- endfor %}]<|tool_call_end|>"
    "{%- endif %}{{ message.content }}<|im_end|>\n{%- endfor %}"
    "{%- if add_generation_prompt %}<|im_start|>assistant\n{%- endif %}"
)


def test_a_forced_call_uses_the_convention_the_grammar_writes(
    prepared_models: tuple[Any, Any],
) -> None:
    from mlx_lm.tokenizer_utils import load

    from router.worker.decoding.tools import syntax_for

    tokenizer = load(
        prepared_models[0], tokenizer_config_extra={"chat_template": PYTHONIC_TEMPLATE}
    )
    native = syntax_for(tokenizer, _request())
    assert native.native and native.start == "<|tool_call_start|>"
    s = ToolStream(native, (WEATHER, TIME))
    pieces = s.feed('<|tool_call_start|>[get_weather(city="Paris")]<|tool_call_end|>') + s.finish()
    assert [(c.name, json.loads(c.arguments)) for c in pieces if isinstance(c, ParsedCall)] == [
        ("get_weather", {"city": "Paris"})
    ]
    forced = syntax_for(tokenizer, _request(tool_choice="required"))
    assert not forced.native and forced.start == "<tool_call>"
