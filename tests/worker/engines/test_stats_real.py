"""The counter's reconstruction of speculative rounds against the forward passes mlx-lm really
makes (in-process, on the prepared default model; catches a change in mlx-lm's round logic)."""

from __future__ import annotations

from typing import Any

import pytest

from router.worker.engines.stats import SpecCounter

pytestmark = pytest.mark.realmodel


class CountingModel:
    """Forwards to a model and records the number of tokens of every forward pass."""

    def __init__(self, model: Any) -> None:
        self.model = model
        self.calls: list[int] = []

    def __call__(self, inputs: Any, *args: Any, **kwargs: Any) -> Any:
        self.calls.append(inputs.shape[1])
        return self.model(inputs, *args, **kwargs)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.model, name)


@pytest.fixture
def loaded(loaded_models: tuple[Any, Any, Any]) -> tuple[Any, Any, Any]:
    return loaded_models  # the session's (model, tokenizer, draft)


@pytest.mark.parametrize(
    ("text", "max_tokens", "consume"),
    [
        ("1, 2, 3, 4,", 7, None),  # the last round is cut short by max_tokens
        ("Once upon a time", 12, 5),  # the client stops mid-generation
    ],
)
def test_counted_rounds_match_the_forward_passes(
    loaded: tuple[Any, Any, Any], text: str, max_tokens: int, consume: int | None
) -> None:
    from mlx_lm import stream_generate

    model, tokenizer, draft = loaded
    target_calls, draft_calls = CountingModel(model), CountingModel(draft)
    prompt = tokenizer.encode(text)
    counter = SpecCounter(3, max_tokens)
    responses = stream_generate(
        target_calls,
        tokenizer,
        prompt,
        max_tokens=max_tokens,
        draft_model=draft_calls,
        num_draft_tokens=3,
    )
    for response in responses:
        counter.observe(response.from_draft)
        if counter.tokens == consume:
            break
    responses.close()
    # Both models prefill the prompt (minus its last token) in one pass first.
    assert target_calls.calls[0] == draft_calls.calls[0] == len(prompt) - 1
    stats = counter.snapshot()
    assert stats.steps == len(target_calls.calls) - 1  # one verification pass per round
    assert stats.drafted == len(draft_calls.calls) - 1  # one draft pass per drafted token
    assert 0 <= stats.accepted <= stats.drafted
