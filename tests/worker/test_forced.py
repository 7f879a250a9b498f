"""The grammar's forced tokens as a draft: its masks are the plain processor's, position for
position, through drafts, rollbacks and divergence (real llguidance and the default model's
tokenizer; no model runs: tokens are picked from random logits)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import mlx.core as mx
import numpy as np
import pytest

from router.worker.constrain import COMPILER, Constraint
from router.worker.forced import ConstraintDraft
from router.worker.protocol import parse_request

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
    constraint = COMPILER.compile(parse_request(body, "chat"), tokenizer)
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
    width = len(tokenizer._tokenizer)
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
    width = len(tokenizer._tokenizer)
    draft = ConstraintDraft.for_constraint(constraint, len(PROMPT))
    before = draft.forced(PROMPT, 8)
    refused = tokenizer.encode("zz", add_special_tokens=False)[0]
    rows = draft.masks(PROMPT, [refused, refused], width)
    assert len(rows) == 3 and not rows[0][refused]
    assert np.array_equal(rows[1], rows[0]) and np.array_equal(rows[2], rows[0])
    assert draft.forced(PROMPT, 8) == before
