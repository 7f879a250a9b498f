"""The grammar's forced tokens as a draft: its masks are the plain processor's, position for
position, through drafts, rollbacks and divergence (real llguidance and the default model's
tokenizer; no model runs: tokens are picked from random logits)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import mlx.core as mx
import numpy as np
import pytest

from router.worker.decoding.constrain import COMPILER, Constraint
from router.worker.drafting.forced import FREE_START, ConstraintDraft, Draft
from router.worker.request.protocol import parse_generation_request

WEATHER = {
    "type": "object",
    "properties": {
        "city": {"type": "string", "maxLength": 12},
        "unit": {"enum": ["celsius", "fahrenheit"]},
    },
    "required": ["city", "unit"],
}
TOOLS = [
    {"type": "function", "function": {"name": "get_weather", "parameters": WEATHER}},
    {
        "type": "function",
        "function": {
            "name": "get_time",
            "parameters": {
                "type": "object",
                "properties": {"tz": {"enum": ["UTC", "CET"]}},
                "required": ["tz"],
            },
        },
    },
]
PROMPT = [1, 2, 3]


@pytest.fixture(scope="module")
def tokenizer(prepared_models: tuple[Path, Path]) -> Any:
    from mlx_lm.tokenizer_utils import load

    return load(prepared_models[0])


def compiled(tokenizer: Any, **fields: Any) -> Constraint:
    body = {"messages": [{"role": "user", "content": "hi"}], **fields}
    constraint = COMPILER.compile(parse_generation_request(body, "chat"), tokenizer)
    assert constraint is not None
    return constraint


def walk(constraint: Constraint, width: int, seed: int) -> tuple[list[int], list[np.ndarray]]:
    """Plain constrained decoding with random logits: the tokens, and the mask before each."""
    processor = constraint.processor()
    rng = np.random.default_rng(seed)
    out: list[int] = []
    masks = []
    for _ in range(120):
        logits = mx.array(rng.standard_normal((1, width)).astype(np.float32))
        masked = processor(mx.array(PROMPT + out), logits)
        masks.append(np.isfinite(np.array(masked[0])))
        token = int(mx.argmax(masked, axis=-1).item())
        out.append(token)
        if token in constraint.eos:
            break
    return out, masks


def test_masks_follow_drafts_rollbacks_and_a_diverging_answer(tokenizer: Any) -> None:
    constraint = compiled(tokenizer, tools=TOOLS, tool_choice="required")
    width = len(tokenizer)
    walks = [walk(constraint, width, seed) for seed in range(6)]
    names = {tokenizer.decode(out).split('"name": "')[1][:8] for out, _ in walks}
    assert len(names) == 2, names  # both tools were called: the walks diverge
    draft = ConstraintDraft.for_constraint(constraint, len(PROMPT))
    for out, masks in walks:  # each walk rolls the previous one back to where they diverge
        for start in range(0, len(out) - 1, 5):
            window = out[start : start + 6]
            rows = draft.masks(PROMPT + out[:start], window[:-1], width)
            assert len(rows) == len(window)
            for i, row in enumerate(rows):
                assert np.array_equal(row, masks[start + i]), (start, i)


def test_forced_tokens_are_a_valid_start_and_name_a_named_tool(tokenizer: Any) -> None:
    named = {"type": "function", "function": {"name": "get_time"}}
    constraint = compiled(tokenizer, tools=TOOLS, tool_choice=named)
    draft = ConstraintDraft.for_constraint(constraint, len(PROMPT))
    forced = draft.forced(PROMPT, 32)
    assert tokenizer.decode(forced).startswith('<tool_call>\n{"name": "get_time"')
    assert draft.forced(PROMPT, 3) == forced[:3]
    assert draft.forced(PROMPT + forced, 32) != forced  # it follows the answer
    assert draft.forced(PROMPT, 0) == []


def test_a_refused_draft_token_repeats_its_row_and_leaves_the_state(tokenizer: Any) -> None:
    constraint = compiled(tokenizer, response_format={"type": "json_object"})
    width = len(tokenizer)
    draft = ConstraintDraft.for_constraint(constraint, len(PROMPT))
    before = draft.forced(PROMPT, 8)
    refused = tokenizer.encode("zz", add_special_tokens=False)[0]
    rows = draft.masks(PROMPT, [refused, refused], width)
    assert len(rows) == 3 and not rows[0][refused]
    assert np.array_equal(rows[1], rows[0]) and np.array_equal(rows[2], rows[0])
    assert draft.forced(PROMPT, 8) == before


def oracle(answer: list[int], prompt_len: int, calls: list[int]) -> Any:
    """A source that knows the answer: proposes what follows the context in it."""

    def propose(context: list[int], k: int) -> list[int]:
        calls.append(len(context))
        done = len(context) - prompt_len
        return answer[done : done + k]

    return propose


def test_one_draft_chains_forced_runs_and_proposals(tokenizer: Any) -> None:
    named = {"type": "function", "function": {"name": "get_weather"}}
    constraint = compiled(tokenizer, tools=TOOLS, tool_choice=named)
    width = len(tokenizer)
    text = (
        '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris", "unit": "celsius"}}'
        "\n</tool_call>"
    )
    answer = tokenizer.encode(text, add_special_tokens=False)
    grammar = ConstraintDraft.for_constraint(constraint, len(PROMPT))
    calls: list[int] = []
    draft = grammar.draft(PROMPT, 64, oracle(answer, len(PROMPT), calls), 3)
    assert draft.tokens == answer[: len(draft.tokens)]
    # forced up to the city's value, three proposed (its quote, "Paris" and the closing),
    # then forced again (the next key)
    first_free = draft.forced.index(False)
    assert tokenizer.decode(draft.tokens[:first_free]).endswith('"city":')
    assert draft.forced[first_free : first_free + 3] == [False] * 3
    assert tokenizer.decode(draft.tokens[first_free : first_free + 3]) == ' "Paris",'
    assert all(draft.forced[first_free + 3 :]) and len(draft.tokens) > first_free + 4
    # one proposal per draft, given the answer and the forced run: a context that only grows
    assert calls == [len(PROMPT) + first_free]
    assert draft.forced_kept(first_free) == first_free
    assert draft.forced_kept(first_free + 2) == first_free
    # the rows are the plain processor's masks, position for position
    assert np.array_equal(draft.mask(width), grammar.masks(PROMPT, draft.tokens, width))
    # and the matcher is back where it was
    assert grammar.forced(PROMPT, 32) == draft.tokens[:first_free][:32]


def test_a_proposal_the_grammar_refuses_ends_the_draft(tokenizer: Any) -> None:
    constraint = compiled(tokenizer, tools=TOOLS, tool_choice="required")
    width = len(tokenizer)
    grammar = ConstraintDraft.for_constraint(constraint, len(PROMPT))
    forced = grammar.forced(PROMPT, 64)
    start = PROMPT + forced  # the grammar now wants a tool's name
    call = tokenizer.encode('<tool_call>\n{"name": "get_weather"', add_special_tokens=False)
    assert call[: len(forced)] == forced
    good = call[len(forced) :][:2]
    refused = tokenizer.encode("zz", add_special_tokens=False)

    def propose(context: list[int], k: int) -> list[int]:
        return [*good, *refused, *good][:k]

    draft = grammar.draft(start, 16, propose, 8)
    assert draft.tokens == good and draft.forced == [False] * len(good)
    assert draft.rows.shape[0] == len(good) + 1
    assert np.array_equal(draft.mask(width), grammar.masks(start, good, width))


def test_one_proposal_per_draft(tokenizer: Any) -> None:
    constraint = compiled(tokenizer, response_format={"type": "json_object"})
    grammar = ConstraintDraft.for_constraint(constraint, len(PROMPT))
    opening = PROMPT + tokenizer.encode('{"note": "', add_special_tokens=False)
    words = tokenizer.encode(" word" * 40, add_special_tokens=False)
    calls: list[int] = []

    def propose(context: list[int], k: int) -> list[int]:
        calls.append(k)
        return words[:k]

    draft = grammar.draft(opening, 16, propose, 3)
    assert calls == [3] and draft.tokens == words[:3]  # inside a string: nothing forced


@pytest.mark.parametrize("budget", [0, 1, 5, 9])
def test_the_draft_stays_within_its_budget(tokenizer: Any, budget: int) -> None:
    named = {"type": "function", "function": {"name": "get_weather"}}
    constraint = compiled(tokenizer, tools=TOOLS, tool_choice=named)
    width = len(tokenizer)
    answer = tokenizer.encode(
        '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"',
        add_special_tokens=False,
    )
    grammar = ConstraintDraft.for_constraint(constraint, len(PROMPT))
    draft = grammar.draft(PROMPT, budget, oracle(answer, len(PROMPT), []), 8)
    assert len(draft.tokens) == budget
    assert draft.tokens == answer[:budget]
    assert draft.forced == [True] * budget  # the forced run comes first
    assert draft.mask(width).shape == (budget + 1, width)


def test_proposals_grow_while_kept_and_shrink_when_refused(tokenizer: Any) -> None:
    constraint = compiled(tokenizer, response_format={"type": "json_object"})
    grammar = ConstraintDraft.for_constraint(constraint, len(PROMPT))
    opening = PROMPT + tokenizer.encode('{"note": "', add_special_tokens=False)
    words = tokenizer.encode(" word" * 40, add_special_tokens=False)
    calls: list[int] = []

    def propose(context: list[int], k: int) -> list[int]:
        calls.append(k)
        return words[:k]

    def step(accepted: int) -> None:
        draft = grammar.draft(opening, 16, propose, 8)
        grammar.verified(draft, accepted)

    step(FREE_START)  # kept whole: two more next time
    step(0)  # refused: one fewer
    step(1)  # partly kept: one fewer
    for _ in range(4):
        step(99)  # kept whole, up to the source's k
    assert calls == [FREE_START, FREE_START + 2, FREE_START + 1, FREE_START, 6, 8, 8]
    for _ in range(12):
        step(0)
    assert calls[-1] == 1  # never below one
    forced_only = Draft([1, 2], [True, True], np.ones((3, 8), dtype=bool))
    before = grammar.free_k
    grammar.verified(forced_only, 0)  # no proposal in it: nothing to learn
    assert grammar.free_k == before


def test_a_draft_cut_keeps_its_first_tokens_and_their_rows() -> None:
    rows = np.eye(4, dtype=bool)
    draft = Draft([5, 6, 7], [True, False, True], rows)
    cut = draft.cut(2)
    assert (cut.tokens, cut.forced) == ([5, 6], [True, False])
    assert np.array_equal(cut.rows, rows[:3])
    assert draft.cut(3) is draft and draft.cut(0).tokens == [] and len(draft.cut(0).rows) == 1


# "x" is optional, and past the parser's items per row once an answer opens it: a draft that
# walks into "x" fails the grammar, an answer that closes the object after "s" does not.
MANY_SHAPES = [{"type": "object", "properties": {f"k{i}": {"type": "string"}}} for i in range(2000)]
OPTIONAL_FAILURE = {
    "type": "json_schema",
    "json_schema": {
        "name": "x",
        "schema": {
            "type": "object",
            "properties": {"s": {"type": "string"}, "x": {"anyOf": MANY_SHAPES}},
            "required": ["s"],
        },
    },
}


def into_the_failure(tokenizer: Any) -> tuple[list[int], list[int]]:
    """(history, proposal): the answer so far, inside "s"'s value, and a proposal closing it
    and opening "x" (every token valid, the last one fails the matcher)."""
    text = tokenizer.encode('{"s": "a", "x": {"', add_special_tokens=False)
    cut = tokenizer.encode('{"s": "a', add_special_tokens=False)
    assert text[: len(cut)] == cut
    return PROMPT + cut, text[len(cut) :]


def test_a_failure_only_in_a_rejected_draft_is_not_reported(tokenizer: Any) -> None:
    constraint = compiled(tokenizer, response_format=OPTIONAL_FAILURE)
    width = len(tokenizer)
    failures: list[str] = []
    grammar = ConstraintDraft.for_constraint(constraint, len(PROMPT), failures.append)
    history, proposal = into_the_failure(tokenizer)
    draft = grammar.draft(history, 16, lambda context, k: proposal[:k], 8)
    grammar.verified(draft, len(draft.tokens) - 1)  # the target refused the last token
    assert failures == []
    # The walk reached the failure (on the token that opens a second key, where plain
    # decoding fails too): the draft ends there, its last row allows only the end.
    assert draft.failed and "items" in draft.failed
    assert 0 < len(draft.tokens) < len(proposal) and draft.tokens == proposal[: len(draft.tokens)]
    assert set(np.flatnonzero(draft.rows[-1])) == set(constraint.eos)
    # The request's matcher is not left in the failed state: the answer goes on and closes.
    closing = tokenizer.encode('b"}', add_special_tokens=False)
    answer = history + closing
    processor = constraint.processor()  # plain decoding's masks along the same answer
    plain = [
        np.isfinite(np.array(processor(mx.array(answer[:end]), mx.zeros((1, width)))[0]))
        for end in range(len(PROMPT), len(answer) + 1)
    ]
    rows = grammar.masks(history, closing, width)
    assert all(
        np.array_equal(row, want) for row, want in zip(rows, plain[-len(rows) :], strict=True)
    )
    assert set(np.flatnonzero(rows[-1])) == set(constraint.eos)  # the object closed: the end
    assert not grammar.draft(answer, 4).failed and failures == []


def test_a_failure_within_the_accepted_run_is_reported_once(tokenizer: Any) -> None:
    constraint = compiled(tokenizer, response_format=OPTIONAL_FAILURE)
    failures: list[str] = []
    grammar = ConstraintDraft.for_constraint(constraint, len(PROMPT), failures.append)
    history, proposal = into_the_failure(tokenizer)
    draft = grammar.draft(history, 16, lambda context, k: proposal[:k], 8)
    assert draft.failed and draft.cut(len(draft.tokens) - 1).failed == ""  # cut before it
    grammar.verified(draft, len(draft.tokens))
    assert len(failures) == 1 and "items" in failures[0]
    # the answer's own state: the next draft from the accepted run does not say it again
    grammar.draft(history + draft.tokens, 4)
    assert len(failures) == 1


@pytest.mark.parametrize("target", ["refuses", "keeps"])
def test_the_speculative_lane_fails_only_when_the_target_keeps_the_run_to_it(
    tokenizer: Any, target: str
) -> None:
    from router.worker.engines.speculative import decode
    from tests.worker.scripted import ScriptedCache, ScriptedLM

    constraint = compiled(tokenizer, response_format=OPTIONAL_FAILURE)
    eos = constraint.eos[0]
    history, proposal = into_the_failure(tokenizer)
    so_far = history[len(PROMPT) :]
    closing = tokenizer.encode('b"}', add_special_tokens=False)
    script = [*so_far, *(closing if target == "refuses" else proposal)]
    model = ScriptedLM([*PROMPT, *script], eos, vocab=len(tokenizer))
    failures: list[str] = []
    grammar = ConstraintDraft.for_constraint(constraint, len(PROMPT), failures.append)
    offered: list[int] = []

    def propose(context: list[int], prompt_len: int, k: int) -> list[int]:
        if context != history:
            return []
        offered.append(len(context))
        return proposal[:k]

    out = list(PROMPT)
    steps = decode(
        model,
        [ScriptedCache()],
        out,
        0,
        max_tokens=32,
        sampler=lambda logprobs: mx.argmax(logprobs, axis=-1),
        propose=propose,
        k=8,
        stop_tokens=frozenset(constraint.eos),
        constraint=grammar,
        forced_k=16,
    )
    for _ in steps:
        pass
    assert offered  # the source did propose the run into the failure
    answer = out[len(PROMPT) :]
    if target == "refuses":  # the answer goes on and closes the object another way
        assert answer == [*so_far, *closing, eos] and failures == []
    else:  # it reaches the failure: the end is all the grammar allows, and it is reported
        kept = answer[len(so_far) : -1]
        assert kept and kept == proposal[: len(kept)] and answer[-1] == eos
        assert len(failures) == 1 and "items" in failures[0]
