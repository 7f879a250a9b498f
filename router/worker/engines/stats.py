"""Speculative-decoding statistics, counted from what mlx-lm's public API exposes.

``mlx_lm.stream_generate`` reports only a per-token ``from_draft`` flag. The rounds behind it
follow ``speculative_generate_step``: a round starting after ``t`` emitted tokens drafts
``min(max_tokens - t, K)`` tokens, verifies them in one target pass, emits the accepted prefix
(``from_draft=True``) and then one target token (``from_draft=False``) -- unless ``max_tokens``
is reached inside the accepted prefix, which ends the round and the generation. The generator
is lazy and computes a whole round before yielding its first token, so every round whose first
token was observed has drafted its full size, even if the consumer stops early (EOS, a stop
string, a cancel): those verified-but-unused drafts count as rejected (R = D - A).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class SpecStats:
    drafted: int = 0
    accepted: int = 0
    steps: int = 0
    num_draft_tokens: int = 0

    @property
    def rejected(self) -> int:
        return self.drafted - self.accepted


class SpecCounter:
    """Reconstructs rounds from the ``from_draft`` flags of one generation."""

    def __init__(self, num_draft_tokens: int, max_tokens: int) -> None:
        if num_draft_tokens < 0 or max_tokens < 1:
            raise ValueError("num_draft_tokens must be >= 0 and max_tokens >= 1")
        self.num_draft_tokens = num_draft_tokens
        self.max_tokens = max_tokens
        self.tokens = 0
        self._drafted = 0
        self._accepted = 0
        self._steps = 0
        self._in_round = False

    def observe(self, from_draft: bool) -> None:
        """Count one generated token (every token stream_generate yields, EOS included)."""
        if self.num_draft_tokens and not self._in_round:
            self._steps += 1
            self._drafted += min(self.max_tokens - self.tokens, self.num_draft_tokens)
            self._in_round = True
        self.tokens += 1
        if from_draft:
            if not self._in_round:
                raise ValueError("a draft token arrived without speculation")
            self._accepted += 1
        else:
            self._in_round = False  # the target's own token closes the round
        if self.tokens >= self.max_tokens:
            self._in_round = False

    def snapshot(self) -> SpecStats:
        if not self.num_draft_tokens:
            return SpecStats()
        return SpecStats(self._drafted, self._accepted, self._steps, self.num_draft_tokens)


def usage(
    prompt_tokens: int, completion_tokens: int, spec: SpecStats, cached_tokens: int = 0
) -> dict[str, object]:
    """The ``usage`` object of the worker contract.

    ``prompt_tokens_details.cached_tokens``: prompt tokens taken from the lane's prompt cache
    instead of being prefilled (OpenAI's field; included in ``prompt_tokens``). The draft
    counts are ``speclane_spec``'s: OpenAI's ``completion_tokens_details`` prediction counts
    belong to a request's ``prediction`` only, and the engines add them for such a request.
    """
    body: dict[str, object] = {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
        "prompt_tokens_details": {"cached_tokens": cached_tokens},
    }
    body["speclane_spec"] = {
        "drafted": spec.drafted,
        "accepted": spec.accepted,
        "rejected": spec.rejected,
        "steps": spec.steps,
        "num_draft_tokens": spec.num_draft_tokens,
    }
    return body
