"""Sampling a pass's positions: greedy decoding needs no normalization over the vocabulary.

A sampler takes log-probabilities (mlx-lm's convention: top-p, min-p and top-k work on them).
The most likely token is the same on raw logits, and normalizing costs one exponential per
vocabulary entry per position, which on a CPU is a real share of a verify pass; so a greedy
request's positions are sampled from the logits as they are.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any


class Greedy:
    """The most likely token at every position (temperature 0)."""

    def __call__(self, scores: Any) -> Any:
        import mlx.core as mx

        return mx.argmax(scores, axis=-1)


GREEDY = Greedy()


def sampler_scores(samplers: list[Callable[[Any], Any]], logits: Any) -> Any:
    """What ``samplers`` sample from: ``logits`` as they are when every one is greedy, else
    their log-probabilities over the last axis."""
    if all(isinstance(s, Greedy) for s in samplers):
        return logits
    import mlx.core as mx

    return logits - mx.logsumexp(logits, axis=-1, keepdims=True)
