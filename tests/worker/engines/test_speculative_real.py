"""Greedy equality on the real default model: every draft source writes exactly what plain
decoding writes, token for token (in-process, short answers)."""

from __future__ import annotations

from typing import Any

import pytest

from router.worker.drafting.drafts import LookupConfig, PredictionConfig, PredictionDraft
from router.worker.drafting.suffix import SuffixConfig, SuffixDraft, SuffixIndex
from router.worker.engines.speculative import (
    DraftModel,
    decode,
    lookup_proposer,
    prediction_proposer,
    suffix_proposer,
)

pytestmark = pytest.mark.realmodel

MAX_TOKENS = 24
CODE = "def add(a, b):\n    return a + b\n\ndef sub(a, b):\n    return a - b\n"
PROMPTS = [
    [{"role": "user", "content": "What is the capital of France?"}],
    [{"role": "user", "content": f"Repeat this code exactly:\n{CODE}"}],
]


@pytest.fixture
def loaded(loaded_models: tuple[Any, Any, Any]) -> tuple[Any, Any, Any]:
    return loaded_models  # the session's (model, tokenizer, draft)


def greedy(logprobs: Any) -> Any:
    import mlx.core as mx

    return mx.argmax(logprobs, axis=-1)


def generate(
    model: Any, tokenizer: Any, prompt: list[int], propose: Any = None, k: int = 0, **how: Any
) -> tuple[list[int], int]:
    from mlx_lm.models.cache import make_prompt_cache

    history = list(prompt)
    steps = list(
        decode(
            model,
            make_prompt_cache(model),
            history,
            0,
            max_tokens=MAX_TOKENS,
            sampler=greedy,
            propose=propose,
            k=k,
            stop_tokens=frozenset(tokenizer.eos_token_ids),
            **how,
        )
    )
    return [t for s in steps for t in s.tokens], sum(s.accepted for s in steps)


def test_a_paced_source_stops_drafting_what_fails_and_keeps_drafting_a_copy(
    loaded: tuple[Any, Any, Any],
) -> None:
    """With positions that cost (the figure fixed, as a CPU measures it), a source whose
    drafts the target refuses soon drafts nothing; one that copies keeps drafting; the
    output is plain decoding's either way."""
    from router.worker.drafting.draftchoice import Chooser, DraftCandidate
    from router.worker.drafting.draftcontrol import PassCost

    def paced(propose: Any, prompt: list[int]) -> Chooser:
        source = DraftCandidate("source", lambda h, k: propose(h, len(prompt), k), 8)
        return Chooser([source], PassCost(0.18))

    model, tokenizer, _ = loaded
    never = len(tokenizer.get_vocab()) - 1  # a token greedy decoding does not pick here
    drafted: list[int] = []

    def wrong(history: list[int], prompt_len: int, k: int) -> list[int]:
        drafted.append(k)
        return [never] * k

    for messages in PROMPTS:
        prompt = prompt_ids(tokenizer, messages)
        plain, _ = generate(model, tokenizer, prompt)
        drafted.clear()
        out, _ = generate(model, tokenizer, prompt, wrong, 8)
        assert out == plain and max(drafted) == 8  # unpaced: the longest the budget allows
        chooser = paced(wrong, prompt)
        out, accepted = generate(model, tokenizer, prompt, chooser=chooser)
        assert out == plain and accepted == 0
        # Then the acceptance is below what pays: the rest are shadow proposals.
        assert chooser.tallies["source"].steps <= 3, chooser.tallies

    prompt = prompt_ids(tokenizer, PROMPTS[1])
    plain, _ = generate(model, tokenizer, prompt)
    _, unpaced = generate(model, tokenizer, prompt, lookup_proposer(LookupConfig()), 8)
    chooser = paced(lookup_proposer(LookupConfig()), prompt)
    out, accepted = generate(model, tokenizer, prompt, chooser=chooser)
    # Paced, the copy is still drafted (each step as far as yields most: at this fixed cost
    # and a short copied run, fewer tokens than the unpaced budget of 8 drafts).
    assert out == plain and unpaced > 0 and accepted > 0


def prompt_ids(tokenizer: Any, messages: list[dict[str, str]]) -> list[int]:
    text = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    return list(tokenizer.encode(text, add_special_tokens=False))


@pytest.mark.parametrize("messages", PROMPTS, ids=["fact", "copy"])
def test_every_draft_source_writes_what_plain_decoding_writes(
    loaded: tuple[Any, Any, Any], messages: list[dict[str, str]]
) -> None:
    from mlx_lm.generate import generate_step
    from mlx_lm.models.cache import make_prompt_cache

    model, tokenizer, draft = loaded
    prompt = prompt_ids(tokenizer, messages)
    plain, _ = generate(model, tokenizer, prompt)

    # The plain loop is mlx-lm's own greedy decoding.
    import mlx.core as mx

    reference = []
    for token, _ in generate_step(mx.array(prompt), model, max_tokens=len(plain)):
        reference.append(int(token))
    assert plain == reference

    # A prediction with one changed line exercises acceptance, rejection and re-alignment.
    text = tokenizer.decode(plain)
    changed = text.replace("return", "yield", 1) if "return" in text else "Paris!" + text
    prediction = PredictionDraft(
        tokenizer.encode(changed, add_special_tokens=False), PredictionConfig()
    )
    # An earlier answer with the same change: the suffix source drafts from it.
    index = SuffixIndex(SuffixConfig())
    index.insert("p", prompt + tokenizer.encode(changed, add_special_tokens=False))
    sources = {
        "suffix": (suffix_proposer(SuffixDraft(index, "p")), 16),
        "prompt_lookup": (lookup_proposer(LookupConfig()), 8),
        "prediction": (prediction_proposer(prediction), 16),
        "draft_model": (DraftModel(draft, make_prompt_cache(draft), []).propose, 3),
    }
    accepted = {}
    for name, (propose, k) in sources.items():
        out, accepted[name] = generate(model, tokenizer, prompt, propose, k)
        assert out == plain, name
    assert accepted["prediction"] > 0
    assert accepted["suffix"] > 0


WEATHER_TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string"}, "unit": {"enum": ["celsius", "fahrenheit"]}},
            "required": ["city", "unit"],
        },
    },
}
CONSTRAINED = {
    "tool_call": {"tools": [WEATHER_TOOL], "tool_choice": "required"},
    "named_function": {
        "tools": [WEATHER_TOOL],
        "tool_choice": {"type": "function", "function": {"name": "get_weather"}},
    },
    "json_schema": {
        "response_format": {
            "type": "json_schema",
            "json_schema": {
                "name": "person",
                "schema": {
                    "type": "object",
                    "properties": {"name": {"type": "string"}, "age": {"type": "integer"}},
                    "required": ["name", "age"],
                },
            },
        }
    },
}


@pytest.mark.parametrize("case", list(CONSTRAINED))
def test_forced_tokens_write_what_plain_constrained_decoding_writes(
    loaded: tuple[Any, Any, Any], case: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    from mlx_lm.models.cache import make_prompt_cache

    from router.worker.decoding.constrain import COMPILER
    from router.worker.drafting.forced import ConstraintDraft
    from router.worker.request.protocol import parse_generation_request

    model, tokenizer, draft_model = loaded
    messages = [{"role": "user", "content": "What is the weather in Paris? Tom is 31 years old."}]
    request = parse_generation_request({"messages": messages, **CONSTRAINED[case]}, "chat")
    constraint = COMPILER.compile(request, tokenizer)
    prompt = prompt_ids(tokenizer, messages)
    eos = frozenset(tokenizer.eos_token_ids)
    chained: list[bool] = []
    draft_of = ConstraintDraft.draft

    def spy(self: ConstraintDraft, *args: Any, **kwargs: Any) -> Any:
        made = draft_of(self, *args, **kwargs)
        chained.append(any(made.forced) and not all(made.forced))
        return made

    def run(**how: Any) -> tuple[list[int], int, int]:
        history = list(prompt)
        steps = list(
            decode(
                model,
                make_prompt_cache(model),
                history,
                0,
                max_tokens=40,
                sampler=greedy,
                stop_tokens=eos,
                **how,
            )
        )
        out = [t for s in steps for t in s.tokens]
        return out, sum(s.forced for s in steps), len(steps)

    def constrained() -> ConstraintDraft:
        return ConstraintDraft.for_constraint(constraint, len(prompt))

    plain, _, plain_steps = run(processors=[constraint.processor()])
    forced, kept, forced_steps = run(constraint=constrained(), forced_k=16)
    assert forced == plain
    assert kept > 0 and forced_steps < plain_steps
    # Forced runs and a source's proposals in one draft: still the same answer, whatever the
    # source (the suffix index holds an earlier answer to a similar question).
    index = SuffixIndex(SuffixConfig())
    index.insert("p", prompt + forced[:-3])
    sources = {
        "prompt_lookup": (lookup_proposer(LookupConfig()), 8),
        "suffix": (suffix_proposer(SuffixDraft(index, "p")), 16),
        "draft_model": (DraftModel(draft_model, make_prompt_cache(draft_model), []).propose, 3),
    }
    monkeypatch.setattr(ConstraintDraft, "draft", spy)
    for name, (propose, k) in sources.items():
        out, _, _ = run(constraint=constrained(), forced_k=16, propose=propose, k=k)
        assert out == plain, name
    assert any(chained)  # some step verified forced and proposed tokens in one pass
