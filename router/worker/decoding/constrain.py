"""Constrained decoding: a grammar per request, a logits processor per job (llguidance).

Used for ``tool_choice: "required"`` or a named function (the answer must be tool calls in the
``<tool_call>{"name": ..., "arguments": ...}</tool_call>`` convention that mlx-lm's
``json_tools`` parser reads), and for ``response_format`` ``json_object`` / ``json_schema``.
With ``tool_choice: "auto"`` and a JSON ``response_format`` the answer is either tool calls or
the JSON document.

Why llguidance (figures in ``examples/results/constraints.md``, from
``examples/bench_constraints.py``): a schema compiles far faster than with xgrammar or
outlines-core (a tool list differs per request, so compile time is paid per request), its
per-token mask costs about what the others' do, it takes Lark grammars with inline JSON
schemas (the tool-call markers around the JSON need a grammar, not only a schema), and it
has no torch dependency (xgrammar's wheel pulls torch and CUDA).

JSON is generated with fixed separators (``", "``, ``": "``) and no free whitespace: with free
whitespace a small model can loop on blanks until ``max_tokens``.

A schema the library cannot follow is refused before the answer starts (a 400 naming
``response_format`` or ``tools``): validation catches what is wrong with it, and a short
probe walk through the start of an answer catches what only fails while matching (an
``anyOf`` of 2,000 object shapes passes validation, then exceeds the parser's items per row
on the answer's first key). Should the matcher still fail mid-answer, the processor closes
the answer and reports it (``on_error``): the engine ends the answer with an error, never a
"stop" whose text breaks the schema.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
import orjson

from router.kernel.errors import bad_request
from router.worker.request.protocol import GenerationRequest, Tool

log = logging.getLogger("speclane.worker")

JSON_OPTIONS = {"whitespace_flexible": False, "item_separator": ", ", "key_separator": ": "}
# The convention the fallback template teaches and the json_tools parser reads back.
CALL_START = "<tool_call>"
CALL_END = "</tool_call>"
# Tokens of an answer walked at compile time; most limits trip at the first branching (an
# object's first key, a call's tool name), a few tokens in.
PROBE_STEPS = 32


def _json_rule(schema: Mapping[str, Any]) -> str:
    options = {**dict(schema.get("x-guidance") or {}), **JSON_OPTIONS}
    return "%json " + orjson.dumps({**closed(schema), "x-guidance": options}).decode()


_SCHEMA_MAPS = frozenset({"properties", "patternProperties", "$defs", "definitions"})
_SUBSCHEMAS = frozenset(
    {
        "items",
        "prefixItems",
        "additionalProperties",
        "not",
        "if",
        "then",
        "else",
        "contains",
        "anyOf",
        "oneOf",
        "allOf",
    }
)


def closed(schema: Any) -> Any:
    """The schema with ``additionalProperties: false`` wherever ``properties`` are listed and
    it says nothing else (OpenAI's strict structured outputs require the same): an open object
    lets the model add keys of any length, and a small model does, until ``max_tokens``.
    Only subschemas are rewritten, never data such as ``const``, ``enum`` or ``default``."""
    if not isinstance(schema, Mapping):
        return schema
    out: dict[str, Any] = {}
    for key, value in schema.items():
        if key in _SCHEMA_MAPS and isinstance(value, Mapping):
            out[key] = {name: closed(sub) for name, sub in value.items()}
        elif key in _SUBSCHEMAS:
            out[key] = [closed(v) for v in value] if isinstance(value, list) else closed(value)
        else:
            out[key] = value
    if "properties" in out and "additionalProperties" not in out:
        out["additionalProperties"] = False
    return out


def _call_schema(tool: Tool) -> dict[str, Any]:
    return {
        "type": "object",
        "properties": {"name": {"const": tool.name}, "arguments": orjson.loads(tool.parameters)},
        "required": ["name", "arguments"],
        "additionalProperties": False,
    }


def tool_calls_grammar(tools: tuple[Tool, ...], forced: str | None, parallel: bool) -> str:
    """Lark rules ``calls``: one call (with ``parallel``, up to one per tool) of the tools."""
    allowed = [t for t in tools if forced is None or t.name == forced]
    # At most one call per allowed tool: a small model that may call again tends to repeat
    # the same call until max_tokens; the cap makes every forced answer end.
    more = len(allowed) - 1 if parallel else 0
    lines = [
        f'calls: call ("\\n" call){{0,{more}}}' if more else "calls: call",
        f"call: {_lark_string(CALL_START + chr(10))} body {_lark_string(chr(10) + CALL_END)}",
        "body: " + " | ".join(f"tool_{i}" for i in range(len(allowed))),
    ]
    lines += [f"tool_{i}: {_json_rule(_call_schema(t))}" for i, t in enumerate(allowed)]
    return "\n".join(lines)


def _lark_string(text: str) -> str:
    return orjson.dumps(text).decode()  # a JSON string literal is a valid Lark string literal


def grammar_parts(request: GenerationRequest) -> dict[str, str]:
    """The request's alternatives as Lark rules, keyed by the parameter each comes from.

    ``tools``: tool calls (forced by ``tool_choice``, or allowed next to a JSON answer);
    ``response_format``: the JSON answer. Empty when decoding is free.
    """
    parts: dict[str, str] = {}
    tools_forced = request.tool_choice == "required" and bool(request.tools)
    json_answer = request.response_format != "text"
    if json_answer and not tools_forced:
        schema = (
            orjson.loads(request.response_schema) if request.response_schema else {"type": "object"}
        )
        parts["response_format"] = f"answer: {_json_rule(schema)}"
    if tools_forced or (json_answer and request.calls_tools):
        parts["tools"] = tool_calls_grammar(
            request.tools, request.forced_tool, request.parallel_tool_calls
        )
    return parts


def lark(parts: Mapping[str, str]) -> str:
    starts = {"tools": "calls", "response_format": "answer"}
    start = " | ".join(starts[key] for key in parts)
    return "\n".join([f"start: {start}", *parts.values()])


@dataclass(frozen=True)
class Constraint:
    """A validated grammar and the tokenizer it is compiled against."""

    grammar: str
    lltokenizer: Any
    eos: tuple[int, ...]
    param: str = "response_format"  # the request parameter the grammar comes from (first)

    def processor(self, on_error: Callable[[str], None] | None = None) -> GrammarProcessor:
        """``on_error(message)``: called once if the matcher fails mid-answer."""
        import llguidance

        matcher = llguidance.LLMatcher(self.lltokenizer, self.grammar)
        return GrammarProcessor(matcher, self.lltokenizer.vocab_size, self.eos, on_error)


class GrammarProcessor:
    """An mlx-lm logits processor: ``(tokens, logits) -> logits`` with disallowed tokens -inf.

    ``tokens`` is the whole context so far (prompt, then each sampled token appended), on both
    lanes: the first call fixes where the answer starts, later calls feed the matcher the
    tokens sampled since.
    """

    def __init__(
        self,
        matcher: Any,
        vocab: int,
        eos: tuple[int, ...],
        on_error: Callable[[str], None] | None = None,
    ) -> None:
        self._matcher = matcher
        self._eos = eos
        self._on_error = on_error
        self._seen: int | None = None
        self._bitmask = np.zeros((vocab + 31) // 32, dtype=np.int32)

    def __call__(self, tokens: Any, logits: Any) -> Any:
        import mlx.core as mx

        n = tokens.size
        if self._seen is None:
            self._seen = n
        elif n > self._seen:
            new = tokens.reshape(-1)[self._seen :].tolist()
            self._seen = n
            for token in new:
                self._matcher.consume_token(token)
        width = logits.shape[-1]
        if self._matcher.is_error():  # a limit the probe did not reach: end the answer, say so
            if self._on_error is not None:
                message = first_line(self._matcher.get_error())
                log.warning("constraint failed: %s", message)
                self._on_error(message)
                self._on_error = None
            allowed = np.zeros(width, dtype=bool)
            allowed[[t for t in self._eos if t < width]] = True
        else:
            self._matcher.unsafe_compute_mask_ptr(self._bitmask.ctypes.data, self._bitmask.nbytes)
            bits = np.unpackbits(self._bitmask.view(np.uint8), bitorder="little")
            allowed = np.zeros(width, dtype=bool)
            n_bits = min(width, bits.size)
            allowed[:n_bits] = bits[:n_bits]
        return mx.where(mx.array(allowed), logits, -mx.inf)


class Compiler:
    """Per-tokenizer state: the llguidance tokenizer is built once, lazily (building it reads
    the whole vocabulary: seconds, not per request)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._cache: dict[int, tuple[Any, Any]] = {}  # id(tokenizer) -> (tokenizer, LLTokenizer)

    def lltokenizer(self, tokenizer: Any) -> Any:
        with self._lock:
            hit = self._cache.get(id(tokenizer))
            if hit is not None and hit[0] is tokenizer:
                return hit[1]
            import llguidance

            # mlx-lm's TokenizerWrapper hands attributes it lacks to the HF tokenizer it
            # wraps: a fast one has its Rust tokenizer there, a slow one has none.
            backend = getattr(tokenizer, "backend_tokenizer", None)
            if backend is None:
                raise ValueError("this model's tokenizer is not a fast (Rust) tokenizer")
            built = llguidance.LLTokenizer(
                backend.to_str(),
                n_vocab=len(tokenizer),
                eos_token=list(tokenizer.eos_token_ids),
            )
            self._cache[id(tokenizer)] = (tokenizer, built)
            return built

    def compile(self, request: GenerationRequest, tokenizer: Any) -> Constraint | None:
        """The request's constraint, or None; a 400 naming the parameter it cannot honour."""
        parts = grammar_parts(request)
        if not parts:
            return None
        try:
            lltok = self.lltokenizer(tokenizer)
        except Exception as e:
            raise bad_request(
                f"constrained decoding is not available: {e}", param=next(iter(parts))
            ) from e
        for param, rules in parts.items():  # one at a time, so the 400 names the culprit
            probe(_validated(lark({param: rules}), lltok, param), lltok, param)
        first = "response_format" if "response_format" in parts else "tools"
        return Constraint(
            _validated(lark(parts), lltok, None), lltok, tuple(tokenizer.eos_token_ids), first
        )


def _validated(lark_text: str, lltok: Any, param: str | None) -> str:
    import llguidance

    grammar = llguidance.LLMatcher.grammar_from_lark(lark_text)
    error = llguidance.LLMatcher.validate_grammar(grammar, lltok)
    if error:
        raise _rejected(error, param)
    return grammar


def probe(grammar: str, lltok: Any, param: str | None, steps: int = PROBE_STEPS) -> None:
    """Walk the start of an answer through the grammar: the forced tokens, else the allowed
    token of the lowest id (in a BPE vocabulary a short one, which keeps the most
    alternatives open). A 400 naming ``param`` if the matcher fails on the way."""
    import llguidance

    matcher = llguidance.LLMatcher(lltok, grammar, log_level=0)
    bitmask = np.zeros((lltok.vocab_size + 31) // 32, dtype=np.int32)
    for _ in range(steps):
        if matcher.is_error() or matcher.is_stopped():
            break
        forced = matcher.compute_ff_tokens()
        if forced:
            matcher.consume_tokens(forced)
            continue
        matcher.unsafe_compute_mask_ptr(bitmask.ctypes.data, bitmask.nbytes)
        if matcher.is_error():
            break
        allowed = np.flatnonzero(np.unpackbits(bitmask.view(np.uint8), bitorder="little"))
        if not allowed.size:
            break
        matcher.consume_token(int(allowed[0]))
    if matcher.is_error():
        raise _rejected(matcher.get_error(), param)


def first_line(message: str) -> str:
    return (message.strip().splitlines() or ["unknown error"])[0]


def _rejected(error: str, param: str | None) -> Exception:
    return bad_request(
        f"the constraint library rejected the schema: {first_line(error)}", param=param
    )


COMPILER = Compiler()
