"""Free draft proposers for the speculative lane (pure: token ids in, token ids out).

- ``PromptLookup``: n-gram drafting as in vLLM's ``ngram`` method and llama.cpp's lookup
  decoding. The last n tokens of the sequence (prompt + output) are looked up where they
  occurred earlier; the tokens that followed are the draft. Longer n-grams are tried first
  (they predict better), the most recent occurrence wins (it is the likeliest continuation of
  what is being copied right now). An index of every n-gram is kept incrementally, so a
  proposal costs O(n) instead of a scan of the whole context.
- ``PredictionDraft``: OpenAI Predicted Outputs. The request's ``prediction`` tokens are the
  draft. The proposer follows the output through the prediction; when the output diverges
  (an inserted, deleted or changed line) it re-aligns by searching the prediction for the
  latest output n-gram, nearest after where it lost track, instead of giving up.

Neither knows anything about models: the engine (``router.worker.engines.speculative``) verifies the
proposals, and only the target's own tokens are ever emitted.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

# How far back a prompt-lookup match is measured: past this a match is as good as certain.
MATCH_REACH = 32


@dataclass(frozen=True)
class LookupConfig:
    ngram_min: int = 2
    ngram_max: int = 4
    max_draft: int = 8

    def __post_init__(self) -> None:
        if not 1 <= self.ngram_min <= self.ngram_max:
            raise ValueError("n-gram sizes must satisfy 1 <= min <= max")
        if self.max_draft < 1:
            raise ValueError("the maximum draft length must be at least 1")


class PromptLookup:
    """Propose the continuation of the latest earlier occurrence of the sequence's suffix."""

    def __init__(self, config: LookupConfig) -> None:
        self.config = config
        self._reset()

    def _reset(self) -> None:
        self.matched = 0  # the last proposal's match length (0: none)
        self._tokens: list[int] = []
        # n -> n-gram -> end (exclusive) of its latest indexed occurrence. Only n-grams ending
        # before the last token are indexed, so a lookup never finds the suffix itself.
        self._index: dict[int, dict[tuple[int, ...], int]] = {
            n: {} for n in range(self.config.ngram_min, self.config.ngram_max + 1)
        }

    def _sync(self, tokens: Sequence[int]) -> None:
        known = len(self._tokens)
        if len(tokens) < known or list(tokens[:known]) != self._tokens:
            self._reset()  # not our sequence: start over
            known = 0
        self._tokens.extend(tokens[known:])
        # Index n-grams ending at positions known..len-1 (the one ending at len stays out).
        first = max(known, 1)
        for end in range(first, len(self._tokens)):
            for n, table in self._index.items():
                if end >= n:
                    table[tuple(self._tokens[end - n : end])] = end

    def grade(self) -> int:
        """The last proposal's match length (``draftchoice.Grade``)."""
        return self.matched

    def propose(self, tokens: Sequence[int], k: int) -> list[int]:
        """Up to ``k`` draft tokens to follow ``tokens`` (the prompt and the output so far)."""
        self._sync(tokens)
        k = min(k, self.config.max_draft)
        size = len(self._tokens)
        if k <= 0:
            return []
        self.matched = 0
        for n in range(self.config.ngram_max, self.config.ngram_min - 1, -1):
            if size < n:
                continue
            end = self._index[n].get(tuple(self._tokens[size - n :]))
            if end is not None:
                self.matched = self._extend(end, n)
                return self._tokens[end : end + k]
        return []

    def _extend(self, end: int, n: int) -> int:
        """How far the match of the last ``n`` tokens at ``end`` reaches back (at most
        ``MATCH_REACH``): the grade of the proposal (``draftchoice.grade_class``)."""
        tokens, size = self._tokens, len(self._tokens)
        while n < MATCH_REACH and end - n > 0 and tokens[end - n - 1] == tokens[size - n - 1]:
            n += 1
        return n


@dataclass(frozen=True)
class PredictionConfig:
    ngram_min: int = 2
    ngram_max: int = 6
    max_draft: int = 16

    def __post_init__(self) -> None:
        if not 1 <= self.ngram_min <= self.ngram_max:
            raise ValueError("n-gram sizes must satisfy 1 <= min <= max")
        if self.max_draft < 1:
            raise ValueError("the maximum draft length must be at least 1")


class PredictionDraft:
    """Follow the output through a predicted text; re-align on divergence.

    ``pos`` is the prediction index the next output token is expected to match, or None while
    out of step. ``matched`` counts the prediction tokens the output reproduced (in step, each
    position once), which is what OpenAI reports as ``accepted_prediction_tokens``; the rest of
    the prediction is ``unmatched`` (its ``rejected_prediction_tokens``).
    """

    def __init__(self, prediction: Sequence[int], config: PredictionConfig) -> None:
        self.prediction = list(prediction)
        self.config = config
        self.pos: int | None = 0 if self.prediction else None
        self._matched: set[int] = set()
        self._seen = 0  # output tokens already followed
        self._hint = 0  # where the output was last in step with the prediction

    @property
    def matched(self) -> int:
        return len(self._matched)

    @property
    def unmatched(self) -> int:
        return len(self.prediction) - self.matched

    def _follow(self, output: Sequence[int]) -> None:
        for token in output[self._seen :]:
            pos = self.pos
            if pos is not None and pos < len(self.prediction) and self.prediction[pos] == token:
                self.pos = pos + 1
                self._matched.add(pos)
                self._hint = pos + 1
            else:
                self.pos = None
        self._seen = len(output)

    def _realign(self, output: Sequence[int]) -> int | None:
        """The prediction index after the latest output n-gram, nearest after the last hint."""
        pred = self.prediction
        for n in range(self.config.ngram_max, self.config.ngram_min - 1, -1):
            if len(output) < n:
                continue
            gram = list(output[-n:])
            ends = [e for e in range(n, len(pred) + 1) if pred[e - n : e] == gram]
            if not ends:
                continue
            after = [e for e in ends if e >= self._hint]
            return min(after) if after else max(ends)
        return None

    def propose(self, output: Sequence[int], k: int) -> list[int]:
        """Up to ``k`` prediction tokens expected to follow ``output`` (the completion so far)."""
        self._follow(output)
        if self.pos is None:
            self.pos = self._realign(output)
            if self.pos is not None:
                self._hint = self.pos
        if self.pos is None or k <= 0:
            return []
        return self.prediction[self.pos : self.pos + min(k, self.config.max_draft)]
