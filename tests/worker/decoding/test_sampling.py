"""router.worker.decoding.sampling: a greedy request samples from the raw logits."""

from __future__ import annotations

import mlx.core as mx

from router.worker.decoding.sampling import GREEDY, sampler_scores
from router.worker.engines.engine import sampler_for
from router.worker.request.protocol import GenerationRequest


def test_greedy_samples_the_logits_as_they_are() -> None:
    logits = mx.array([[0.5, 3.0, -1.0], [2.0, 1.0, 0.0]])
    assert sampler_scores([GREEDY, GREEDY], logits) is logits  # nothing normalized
    assert GREEDY(logits).tolist() == [1, 0]


def test_any_other_sampler_gets_log_probabilities() -> None:
    logits = mx.array([[0.5, 3.0, -1.0]])
    scores = sampler_scores([GREEDY, lambda x: x], logits)
    assert scores is not logits
    assert abs(float(mx.logsumexp(scores, axis=-1)[0])) < 1e-5  # probabilities sum to 1


def test_temperature_zero_is_greedy_whatever_the_other_knobs() -> None:
    assert (
        sampler_for(GenerationRequest("completion", prompt="x", temperature=0.0, top_p=0.5))
        is GREEDY
    )
    assert sampler_for(GenerationRequest("completion", prompt="x", temperature=0.7)) is not GREEDY
