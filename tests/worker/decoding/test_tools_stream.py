"""A JSON-syntax tool call streamed as it is written (pure: no model, the real json_tools
parser): the head once the name is closed, then the arguments' raw text piece by piece."""

from __future__ import annotations

import json
from typing import Any

import pytest

from router.worker.decoding.tools import (
    ArgumentsScanner,
    CallDelta,
    ParsedCall,
    Piece,
    ToolStream,
    ToolSyntax,
    fallback_syntax,
)
from router.worker.request.protocol import Tool

WRITE = Tool("write", "Write a file", '{"type":"object"}')
READ = Tool("read", None, '{"type":"object"}')

# Arguments that a brace/quote counter without string state would get wrong.
TRICKY = (
    '{"path": "a}b{c.py", "text": "def f():\\n    return \\"}\\" + \'{\' # \\\\", '
    '"nested": {"list": [1, {"x": "]"}, [], {}], "e\\u00e9": "\u00e9t\u00e9 \u2603 \U0001f600"}, '
    '"empty": "", "slash": "\\\\"}'
)
SIMPLE = '{"path": "README.md"}'


def call(name: str, arguments: str, space: str = " ") -> str:
    body = f'{{"name":{space}"{name}",{space}"arguments":{space}{arguments}}}'
    return f"<tool_call>\n{body}\n</tool_call>"


def make(incremental: bool = True, **kw: Any) -> ToolStream:
    return ToolStream(fallback_syntax(), (WRITE, READ), incremental=incremental, **kw)


def feed(s: ToolStream, chunks: list[str]) -> list[Piece]:
    return [p for c in chunks for p in s.feed(c)] + s.finish()


def streamed(pieces: list[Piece]) -> dict[int, dict[str, Any]]:
    """What an OpenAI client accumulates from the deltas, per call index."""
    calls: dict[int, dict[str, Any]] = {}
    for p in pieces:
        if isinstance(p, CallDelta):
            d = p.delta()
            slot = calls.setdefault(
                d["index"], {"id": None, "name": None, "arguments": "", "fragments": 0}
            )
            if "id" in d:
                assert slot["id"] is None and slot["arguments"] == ""  # the head comes first
                slot["id"], slot["name"] = d["id"], d["function"]["name"]
                assert d["type"] == "function" and d["function"]["arguments"] == ""
            else:
                assert slot["id"] is not None and d["function"]["arguments"]
                slot["arguments"] += d["function"]["arguments"]
                slot["fragments"] += 1
    return calls


def whole(text: str) -> list[ParsedCall]:
    """The non-streamed reading of the same text."""
    s = make(incremental=False)
    return [p for p in feed(s, [text]) if isinstance(p, ParsedCall)]


def splits(text: str) -> list[list[str]]:
    """The text in two pieces at every boundary, and one character at a time."""
    return [[text[:i], text[i:]] for i in range(len(text) + 1)] + [list(text)]


@pytest.mark.parametrize("arguments", [SIMPLE, TRICKY, "{}", '{"a": {"b": {"c": [[]]}}}'])
@pytest.mark.parametrize("space", [" ", "", "\n  "])
def test_the_arguments_stream_exactly_whatever_the_chunking(arguments: str, space: str) -> None:
    text = "Let me write it.\n" + call("write", arguments, space) + "\n"
    (expected,) = whole(text)
    for chunks in splits(text):
        s = make()
        pieces = feed(s, chunks)
        assert "".join(p for p in pieces if isinstance(p, str)) == "Let me write it."
        assert not any(isinstance(p, ParsedCall) for p in pieces)
        (got,) = streamed(pieces).values()
        assert got["name"] == "write" and got["id"].startswith("call_")
        assert got["arguments"] == arguments  # the model's raw text, exactly
        assert json.loads(got["arguments"]) == json.loads(expected.arguments)
        assert [(c.index, c.id, c.name, c.arguments) for c in s.calls] == [
            (0, got["id"], "write", arguments)
        ]


def test_every_three_piece_chunking_of_a_short_call() -> None:
    text = call("read", '{"p": "}\\"{"}')
    for i in range(len(text) + 1):
        for j in range(i, len(text) + 1):
            (got,) = streamed(feed(make(), [text[:i], text[i:j], text[j:]])).values()
            assert got["arguments"] == '{"p": "}\\"{"}'


def test_the_arguments_go_out_before_the_call_ends() -> None:
    text = call("write", TRICKY)
    end = text.index(TRICKY) + len(TRICKY)  # the arguments' closing brace
    s = make()
    pieces = [p for ch in text[:end] for p in s.feed(ch)]
    got = streamed(pieces)[0]
    assert got["arguments"] == TRICKY  # all of it, before the outer brace and the end marker
    assert got["fragments"] > 10
    # The head went out as soon as the arguments object began.
    head_at = next(i for i, p in enumerate(pieces) if isinstance(p, CallDelta) and p.name)
    assert pieces[head_at + 1] == CallDelta(0, arguments="{")
    rest = [p for ch in text[end:] for p in s.feed(ch)] + s.finish()
    assert rest == []  # closing the call sends nothing more
    assert s.calls[0].arguments == TRICKY


def test_the_head_waits_for_the_arguments_object() -> None:
    s = make()
    assert s.feed('<tool_call>\n{"name": "write", "arguments": ') == []
    (head,) = s.feed("{")[:1]
    assert isinstance(head, CallDelta) and head.name == "write" and head.id


def test_a_name_with_escapes_is_decoded() -> None:
    got = streamed(feed(make(), [call("wr\\u0069te", SIMPLE)]))
    assert got[0]["name"] == "write"


@pytest.mark.parametrize(
    "body",
    [
        '{"arguments": {"path": "x"}, "name": "read"}',  # keys in the other order
        '{"name": "read", "arguments": "{\\"path\\": \\"x\\"}"}',  # arguments as a string
        '[{"name": "read", "arguments": {"path": "x"}}]',  # a list of calls
        '{"name":"read","id":"1","arguments":{"path":"x"}}',  # another key in between
    ],
)
def test_other_shapes_are_sent_whole_at_their_end(body: str) -> None:
    text = f"<tool_call>\n{body}\n</tool_call>"
    for chunks in ([text], list(text)):
        s = make()
        pieces = feed(s, chunks)
        assert not any(isinstance(p, CallDelta) for p in pieces)
        (parsed,) = [p for p in pieces if isinstance(p, ParsedCall)]
        assert (parsed.name, json.loads(parsed.arguments)) == ("read", {"path": "x"})
        assert pieces[-1] is parsed  # only at the end


def test_a_native_syntax_is_sent_whole() -> None:
    from mlx_lm.tool_parsers import pythonic

    syntax = ToolSyntax(True, "<|tool_call_start|>", "<|tool_call_end|>", pythonic.parse_tool_call)
    s = ToolStream(syntax, (WRITE, READ), incremental=True)
    pieces = feed(s, list('<|tool_call_start|>[read(path="x")]<|tool_call_end|>'))
    assert [type(p) for p in pieces] == [ParsedCall]


def test_a_call_cut_by_max_tokens_is_kept_as_streamed() -> None:
    text = '<tool_call>\n{"name": "write", "arguments": {"path": "a.py", "text": "x = {'
    s = make()
    pieces = feed(s, list(text))  # finish() without the end marker: the answer was cut
    got = streamed(pieces)[0]
    assert got["arguments"] == '{"path": "a.py", "text": "x = {'
    assert [p for p in pieces if isinstance(p, str)] == []  # not given back as content
    assert len(s.calls) == 1 and s.calls[0].arguments == got["arguments"]
    # Not streamed, the same: the call with what was written (OpenAI's cut call), no content.
    plain = make(incremental=False)
    (only,) = feed(plain, [text])
    assert isinstance(only, ParsedCall) and plain.calls == [only]
    assert (only.name, only.arguments) == ("write", got["arguments"])


def test_a_cut_before_the_head_is_content() -> None:
    text = '<tool_call>\n{"name": "wri'
    s = make()
    assert feed(s, list(text)) == [text] and s.calls == []


def test_invalid_json_after_the_head_is_kept_as_streamed() -> None:
    text = '<tool_call>\n{"name": "read", "arguments": {"path": "x"},}\n</tool_call>after'
    s = make()
    pieces = feed(s, [text])
    assert streamed(pieces)[0]["arguments"] == '{"path": "x"}'
    assert [p for p in pieces if isinstance(p, str)] == ["after"]
    # Not streamed: the unparsable call is content.
    assert whole(text) == []


def test_two_calls_in_a_row() -> None:
    text = call("read", SIMPLE) + "\n" + call("write", TRICKY)
    for chunks in splits(text):
        s = make()
        pieces = feed(s, chunks)
        got = streamed(pieces)
        assert [(i, got[i]["name"], got[i]["arguments"]) for i in got] == [
            (0, "read", SIMPLE),
            (1, "write", TRICKY),
        ]
        assert got[0]["id"] != got[1]["id"]
        assert not any(isinstance(p, str) for p in pieces)  # the newline between is not content
        # Each call's deltas are contiguous: the second starts after the first ended.
        indexes = [p.index for p in pieces if isinstance(p, CallDelta)]
        assert indexes == sorted(indexes)


def test_without_parallel_calls_the_second_is_dropped_not_streamed() -> None:
    text = call("read", SIMPLE) + "\n" + call("write", TRICKY)
    s = make(parallel=False)
    pieces = feed(s, list(text))
    assert list(streamed(pieces)) == [0]
    assert not any(isinstance(p, ParsedCall) for p in pieces)
    assert [c.name for c in s.calls] == ["read"]


def test_the_scanner_alone() -> None:
    scanner = ArgumentsScanner()
    assert scanner.feed(' {"name" : "f" ,') == (False, "")
    assert scanner.state == "head" and scanner.name == "f"
    assert scanner.feed(' "arguments" :\t{"a"') == (True, '{"a"')
    assert scanner.feed(': "}"} , "x": 1}') == (False, ': "}"}')
    assert scanner.state == "after"
    off = ArgumentsScanner()
    assert off.feed('{"name": 3') == (False, "") and off.state == "off"
    long = ArgumentsScanner()
    long.feed('{"name": "' + "n" * 300)
    assert long.state == "off"  # a name longer than MAX_NAME is not streamed
