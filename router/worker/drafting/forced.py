"""Drafting under a decoding constraint: the grammar's forced tokens, verified like any draft.

A constrained answer (tool calls, ``json_schema``) is full of text the grammar forces: the
``<tool_call>`` marker, braces, quotes, key names, a named function. llguidance computes those
tokens (``compute_ff_tokens``, its jump-forward / fast-forward tokens). Emitting them outright
would not be lossless: they are the grammar's canonical tokenization of the forced bytes, and
plain constrained decoding may spell the same bytes with other tokens. So they are a draft:
the speculative lane feeds them through the target in one forward pass, masks every position
with the grammar's mask in the state after the draft tokens before it, samples each position
and keeps the run the target agrees with. Every emitted token is then the target's own sample
under the exact mask plain constrained decoding applies, so the output is plain constrained
decoding's, token for token (greedy), and drawn from the same distribution (sampling).

One step's draft chains both kinds (``ConstraintDraft.draft``): the forced run, then the
request's own source (prompt lookup, suffix, its prediction; the draft model) proposing what
follows it, then the run the grammar forces after that, all verified in the one forward
pass. A free draft token the grammar refuses ends the draft there (verifying it could
only waste a position). The mask rows are computed on the same walk through the grammar, so
the matcher walks each draft once. The grammar's masks cost far less than a forward pass:
what costs is verifying positions the target refuses, so the source's proposals start short
and grow only while the target keeps them (``FREE_START``).

``ConstraintDraft`` holds the request's matcher, kept in step with the answer: it follows the
emitted tokens, and walks each draft on a copy of it to compute the per-position masks.

A draft may walk into a state where the grammar fails although every token was valid (a
parser limit, such as the items per row of a wide ``anyOf``, trips on consuming the token
that opens it). llguidance's matcher never leaves an error state, and the target may refuse
the tokens that led there, so the walk runs on a copy (``deep_copy`` costs microseconds) and
the draft ends at the failure, its last row allowing only the end of the answer. The failure
is reported (``on_error``: the answer ends with ``constraint_failed``) from the accept step,
``verified``, only when the target kept the tokens up to it; as plain constrained decoding
reports it, once the answer has reached it.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from router.worker.decoding.constrain import first_line

log = logging.getLogger("speclane.worker")

FORCED_MAX_DRAFT = 16  # draft tokens verified per step when the grammar forces some
# The source's proposals between forced runs: this many tokens at first, two more after a
# proposal kept whole, one fewer after one the target refused (at least one), as
# transformers' "heuristic" assistant-token schedule. Most of a JSON answer's free text is
# new, where proposals fail; a list that repeats itself is copied, where they hold.
FREE_START = 4

Propose = Callable[[list[int], int], list[int]]  # (context, k) -> up to k draft tokens


@dataclass(frozen=True)
class Draft:
    """One step's draft under the grammar: its tokens, which of them were forced, and the
    mask rows (row i: what the grammar allows after the answer and ``tokens[:i]``)."""

    tokens: list[int]
    forced: list[bool]
    rows: np.ndarray  # (1 + len(tokens), the grammar's vocabulary rounded up to 32) booleans
    # The grammar's error in the state after all the tokens (its last row allows only the
    # end), or "": reported only if the target keeps every token.
    failed: str = ""

    def mask(self, width: int) -> np.ndarray:
        """The rows cut or padded (nothing allowed) to the logits' ``width``."""
        have = self.rows.shape[1]
        if have >= width:
            return self.rows[:, :width]
        return np.pad(self.rows, ((0, 0), (0, width - have)))

    def cut(self, n: int) -> Draft:
        """The first ``n`` tokens and their rows (the batching lane cuts a draft to the
        tokens a sequence may still emit)."""
        if n >= len(self.tokens):
            return self
        n = max(0, n)
        return Draft(self.tokens[:n], self.forced[:n], self.rows[: n + 1])  # before a failure

    def forced_kept(self, accepted: int) -> int:
        """How many of the first ``accepted`` draft tokens the grammar forced."""
        return sum(self.forced[:accepted])


class ConstraintDraft:
    """One constrained request's matcher, and the draft and masks it gives each step."""

    def __init__(
        self,
        matcher: Any,
        vocab: int,
        eos: Sequence[int],
        prompt_len: int,
        on_error: Callable[[str], None] | None = None,
    ) -> None:
        self._matcher = matcher
        self._eos = tuple(eos)
        self._start = prompt_len
        self._consumed: list[int] = []  # the answer tokens the matcher has taken, in order
        self._bitmask = np.zeros((vocab + 31) // 32, dtype=np.int32)
        self._width = self._bitmask.size * 32
        self._on_error = on_error
        self.free_k = FREE_START  # the length of the source's next proposal, at most k

    @classmethod
    def for_constraint(
        cls, constraint: Any, prompt_len: int, on_error: Callable[[str], None] | None = None
    ) -> ConstraintDraft:
        """From a compiled ``router.worker.decoding.constrain.Constraint``."""
        import llguidance

        matcher = llguidance.LLMatcher(constraint.lltokenizer, constraint.grammar)
        return cls(matcher, constraint.lltokenizer.vocab_size, constraint.eos, prompt_len, on_error)

    def _sync(self, history: Sequence[int]) -> None:
        """Bring the matcher to the end of ``history`` (the prompt and the answer so far)."""
        answer = history[self._start :]
        keep = 0
        for had, has in zip(self._consumed, answer, strict=False):
            if had != has:
                break
            keep += 1
        if keep < len(self._consumed):
            self._matcher.rollback(len(self._consumed) - keep)
            del self._consumed[keep:]
        for token in answer[keep:]:
            self._matcher.consume_token(token)
            self._consumed.append(token)

    def forced(self, history: Sequence[int], k: int) -> list[int]:
        """Up to ``k`` tokens the grammar forces after ``history``."""
        self._sync(history)
        if k <= 0 or self._matcher.is_error() or self._matcher.is_stopped():
            return []
        return [int(t) for t in self._matcher.compute_ff_tokens()[:k]]

    def draft(
        self,
        history: Sequence[int],
        budget: int,
        propose: Propose | None = None,
        k: int = 0,
    ) -> Draft:
        """Up to ``budget`` draft tokens after ``history`` and their mask rows: the forced run,
        then up to ``k`` (and ``free_k``) tokens from ``propose`` (given ``history`` and the
        forced run), then the run forced after those. A proposed token the grammar refuses
        ends the draft there, and so does a state where the grammar fails (``Draft.failed``:
        ``verified`` reports it if the target keeps the tokens up to it)."""
        self._sync(history)
        if k > 0:
            self.free_k = min(self.free_k, k)
        matcher = self._matcher.deep_copy()  # an error state there must not stay in ours
        width = self._width
        tokens: list[int] = []
        forced: list[bool] = []
        rows: list[np.ndarray] = []

        def take(run: Sequence[int], is_forced: bool) -> None:
            for token in run:
                row = self._allowed(matcher, width)
                if matcher.is_error():  # its mask was the one that failed: the draft ends
                    return
                rows.append(row)
                matcher.consume_token(token)
                tokens.append(token)
                forced.append(is_forced)

        # The forced run, the source's proposal after it, the run forced after that. One
        # proposal per draft: the source then sees only the answer and forced tokens, which
        # the target nearly always keeps, so its context only ever grows (after a refused
        # token it would re-index the whole context).
        if not _done(matcher):
            take([int(t) for t in matcher.compute_ff_tokens()[:budget]], True)
        room = budget - len(tokens)
        if propose is not None and k > 0 and room > 0 and not _done(matcher):
            proposed = propose([*history, *tokens], min(k, self.free_k, room))
            valid = matcher.validate_tokens(proposed) if proposed else 0
            take(proposed[:valid], False)
            if valid and valid == len(proposed) and not _done(matcher):
                take([int(t) for t in matcher.compute_ff_tokens()[: budget - len(tokens)]], True)
        rows.append(self._allowed(matcher, width))
        failed = first_line(matcher.get_error()) if matcher.is_error() else ""
        if failed and not tokens:  # the answer itself has reached it
            self._report(failed)
        return Draft(tokens, forced, np.stack(rows), failed)

    def verified(self, draft: Draft, accepted: int) -> None:
        """The target kept the first ``accepted`` tokens of ``draft``: report the grammar's
        failure if they reach it; lengthen or shorten the source's next proposals."""
        if draft.failed and accepted >= len(draft.tokens):
            self._report(draft.failed)
        free = [i for i, forced in enumerate(draft.forced) if not forced]
        if not free:
            return
        if free[-1] < accepted:
            self.free_k += 2
        else:
            self.free_k = max(1, self.free_k - 1)

    def masks(self, history: Sequence[int], draft: Sequence[int], width: int) -> np.ndarray:
        """(1 + len(draft), width) booleans: row i is the grammar's mask after ``history``
        and ``draft[:i]``. Rows after a draft token the grammar refuses repeat its row: the
        target's sample there cannot be that token, so nothing after it is ever kept."""
        self._sync(history)
        matcher = self._matcher.deep_copy()
        valid = matcher.validate_tokens(list(draft)) if draft else 0
        rows = []
        for i in range(valid + 1):
            rows.append(self._allowed(matcher, width))
            if i == 0 and matcher.is_error():  # the answer itself has reached it
                self._report(first_line(matcher.get_error()))
            if i < valid:
                matcher.consume_token(draft[i])
        rows += [rows[-1]] * (len(draft) - valid)
        return np.stack(rows)

    def _allowed(self, matcher: Any, width: int) -> np.ndarray:
        """``matcher``'s mask; in an error state, as GrammarProcessor's: only the end."""
        allowed = np.zeros(width, dtype=bool)
        if not matcher.is_error():
            matcher.unsafe_compute_mask_ptr(self._bitmask.ctypes.data, self._bitmask.nbytes)
        if matcher.is_error():
            allowed[[t for t in self._eos if t < width]] = True
            return allowed
        bits = np.unpackbits(self._bitmask.view(np.uint8), bitorder="little")
        n_bits = min(width, bits.size)
        allowed[:n_bits] = bits[:n_bits]
        return allowed

    def _report(self, message: str) -> None:
        if self._on_error is not None:  # once: the answer ends with the first failure
            log.warning("constraint failed: %s", message)
            self._on_error(message)
            self._on_error = None


def _done(matcher: Any) -> bool:
    return bool(matcher.is_error() or matcher.is_stopped())
