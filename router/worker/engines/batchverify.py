"""The batching lane's verify step: every sequence of the batch checks its own draft in the
one forward pass of a decoding step.

mlx-lm's ``GenerationBatch`` (the decoding sequences of a ``BatchGenerator``) keeps, per row,
the tokens in its KV cache (``tokens``), a *pending* token (``_next_tokens``: sampled at the
previous step, not yet emitted nor in the cache), its sampler, logits processors, stop
matcher and token count. A plain step feeds each row's pending token, samples the next one
and emits the fed one.

``DraftingBatch`` (a ``GenerationBatch``; ``drafting_generator`` puts one in a
``BatchGenerator``, whose prefill, insertion, removal and cache extraction stay mlx-lm's)
asks its ``drafter`` for each row's draft ``d_i`` (possibly none) to follow the pending
token. With no draft in the batch the step is mlx-lm's own. Otherwise each row's input is its
pending token and its draft, padded on the right to the step's width ``1 + max(d_i)``; one
forward pass of the target over the batch computes every position (the causal mask keeps a
row's real positions from seeing its padding); each row is sampled at every position, and
row ``i`` emits its pending token plus the longest prefix of its draft that the target's
samples reproduce (``n_i`` tokens), the sample after it becoming its new pending token. So
every emitted token is the target's own sample given exactly the emitted prefix: greedy
output is plain decoding's token for token, and with sampling each token is the target's
draw (a draft token is kept only when the sample equals it), as on the speculative lane.

Per-sequence trimming: the pass added ``width`` positions to every row of the cache; row
``i`` keeps its emitted ``1 + n_i`` (fewer where it finished inside the run). The positions
all rows reject are trimmed off the end (``trim``); the rest of each row's rejected tail is
shifted out: the row's span moves right and its front becomes left padding, masked from then
on (what mlx-lm's ``BatchKVCache.finalize()`` does after a right-padded prefill).
Rows that accepted different lengths stay consistent, and a row's extracted cache
(``extract``) is exactly its tokens.

Only plain ``BatchKVCache`` layers can be trimmed per row: a batch holding any other kind
(rotating caches of sliding-window models, state-space layers) decodes plainly. A row with
logits processors drafts only under its decoding constraint: the drafter gives such a row a
``router.worker.drafting.forced.Draft`` (the grammar's forced runs chained with its source's
proposals, and the grammar's mask at every position, computed on the walk through the
grammar and rolled back), whose masks stand in for the row's processors in that pass; its
processors see the emitted tokens in their context afterwards, so a later plain step masks
exactly as plain constrained decoding would. A row with other processors never drafts
(``router.worker.drafting.draftlength``): its processors see one token per step, as in
mlx-lm's step.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from functools import cache
from typing import Any, cast

from router.worker.decoding.sampling import sampler_scores
from router.worker.drafting.forced import Draft

# (uids, histories, room) -> drafts. A history is the row's tokens in the cache plus its
# pending token; ``room`` is how many tokens the row may still emit. A row's draft is its
# tokens, or a ``Draft`` under its decoding constraint (tokens and the grammar's masks).
RowDraft = list[int] | Draft
Drafter = Callable[[list[int], list[list[int]], list[int]], list[RowDraft]]

# While a sequence of the batch drafts, one plain step in this many is timed on its own.
PLAIN_TIMED_EVERY = 4


@dataclass(frozen=True)
class Verified:
    """One row's verify step: ``drafted`` draft tokens checked, ``accepted`` of them emitted,
    ``forced`` of those forced by its grammar."""

    uid: int
    drafted: int
    accepted: int
    forced: int = 0


def fitted(draft: RowDraft, room: int, has_processors: bool) -> RowDraft:
    """A row's draft as verified: at most ``room - 1`` tokens (the pending token is emitted
    too); none for a row with processors unless its grammar's masks come with it."""
    limit = max(0, room - 1)
    if isinstance(draft, Draft):
        return draft.cut(limit) if draft.tokens else []
    return [] if has_processors else draft[:limit]


def tokens_of(draft: RowDraft) -> list[int]:
    return draft.tokens if isinstance(draft, Draft) else draft


def accepted_prefix(draft: list[int], sampled: list[int]) -> int:
    """How many leading draft tokens the target's samples reproduce."""
    n = 0
    while n < len(draft) and sampled[n] == draft[n]:
        n += 1
    return n


def row_trims(width: int, kept: list[int]) -> tuple[int, list[int]]:
    """(positions every row drops off the end, each row's further positions to roll into
    its left padding) after a pass of ``width`` positions where row ``i`` keeps ``kept[i]``."""
    drops = [width - k for k in kept]
    common = min(drops)
    return common, [d - common for d in drops]


def trimmable(caches: list[Any]) -> bool:
    """Every layer a plain ``BatchKVCache`` (its rows can be trimmed apart)."""
    from mlx_lm.models.cache import BatchKVCache

    return bool(caches) and all(type(c) is BatchKVCache for c in caches)


def trim_rows(caches: list[Any], width: int, kept: list[int]) -> None:
    """Drop each row's rejected tail after a pass of ``width`` positions (row ``i`` keeps
    ``kept[i]``): what every row rejects is trimmed off the end; the rest of a row's tail is
    shifted out by moving the row's span right, its stale front becoming left padding (the
    effect of mlx-lm's ``finalize`` after a right-padded prefill, as slice copies of the rows
    that need it rather than a gather over the whole batch, several times slower on a CPU)."""
    import mlx.core as mx

    common, extra = row_trims(width, kept)
    shift = mx.array(extra)
    for c in caches:
        if common:
            c.trim(common)
        if not max(extra):
            continue
        end = c._idx
        for i, r in enumerate(extra):
            if r:
                c.keys[i : i + 1, :, r:end] = c.keys[i : i + 1, :, : end - r]
                c.values[i : i + 1, :, r:end] = c.values[i : i + 1, :, : end - r]
        c.offset = c.offset - shift
        c.left_padding = c.left_padding + shift


@cache
def batch_class() -> type:
    """``DraftingBatch``, made on first use (mlx-lm is imported on the generation thread)."""
    from mlx_lm.generate import GenerationBatch

    class DraftingBatch(GenerationBatch):
        drafter: Drafter | None = None
        verified: tuple[Verified, ...] = ()  # the last step's, per row that drafted
        timed: tuple[int, int, float] | None = None  # its pass: rows, width, seconds
        plain_steps = 0  # plain steps taken while a sequence could draft
        time_plain = False  # time the next plain step whatever the count (none timed yet)

        def next(self) -> list[Any]:
            self.verified = ()
            self.timed = None
            if self.drafter is None or not self.uids or not trimmable(self.prompt_cache):
                return super().next()
            pending = cast("list[int]", self._next_tokens.tolist())  # (batch,) uint32
            # No room, so no draft, for a row whose first token has not gone out: a verify
            # pass is wider than a plain step, and the first token is what a client waits on.
            room = [
                m - n if n else 0 for m, n in zip(self.max_tokens, self._num_tokens, strict=True)
            ]
            histories = [[*t, y] for t, y in zip(self.tokens, pending, strict=True)]
            proposed = self.drafter(list(self.uids), histories, room)
            processors = self.logits_processors or [[] for _ in proposed]
            fitting = [fitted(d, room[i], bool(processors[i])) for i, d in enumerate(proposed)]
            if not any(tokens_of(d) for d in fitting):
                return self._plain()
            return self._verify(pending, fitting)

        def _plain(self) -> list[Any]:
            """mlx-lm's step; one in ``PLAIN_TIMED_EVERY`` waited for, so that its time is
            its own pass's (pipelined, it overlaps what follows it), to weigh against a
            verify pass's; the others keep mlx-lm's pipelining."""
            import mlx.core as mx

            self.plain_steps += 1
            if self.plain_steps % PLAIN_TIMED_EVERY and not self.time_plain:
                return super().next()
            mx.eval(self._next_tokens)  # the step before it, still computing when pipelined
            rows, started = len(self.uids), time.perf_counter()
            responses = super().next()
            if self._next_tokens is not None:
                mx.eval(self._next_tokens)
            self.timed = (rows, 1, time.perf_counter() - started)
            return responses

        def _verify(self, pending: list[int], fitting: list[RowDraft]) -> list[Any]:
            import mlx.core as mx

            size = len(self.uids)
            drafts = [tokens_of(d) for d in fitting]
            width = 1 + max(len(d) for d in drafts)
            rows = [
                [y, *d] + [0] * (width - 1 - len(d)) for y, d in zip(pending, drafts, strict=True)
            ]
            started = time.perf_counter()
            inputs = mx.array(rows, dtype=mx.uint32)
            logits = self.model(inputs, cache=self.prompt_cache)  # (size, width, vocab)
            masked = [d if isinstance(d, Draft) else None for d in fitting]
            if any(self.logits_processors or ()) or any(m is not None for m in masked):
                logits = mx.stack(
                    [
                        self._processed(e, inputs, logits[e])
                        if (grammar := masked[e]) is None
                        else grammar_masked(grammar, logits[e])
                        for e in range(size)
                    ]
                )
            # The responses' log-probabilities stay lazy: nothing reads them unless asked.
            logprobs = logits - mx.logsumexp(logits, axis=-1, keepdims=True)
            rows_sampled = self._sample(sampler_scores(self._row_samplers(), logits))
            self.timed = (size, width, time.perf_counter() - started)

            emitted: list[list[int]] = []
            finish: list[str | None] = []
            step_logprobs: list[list[Any]] = []
            next_tokens: list[int] = []
            next_logprobs: list[Any] = []
            verified: list[Verified] = []
            for i, (draft, got) in enumerate(zip(drafts, rows_sampled, strict=True)):
                n = accepted_prefix(draft, got)
                run = [pending[i], *draft[:n]]
                reason = None
                taken = 0
                for token in run:
                    taken += 1
                    self._num_tokens[i] += 1
                    if self._num_tokens[i] >= self.max_tokens[i]:
                        reason = "length"
                    if self._matchers[i].advance(token):
                        reason = "stop"
                    if reason is not None:
                        break
                run = run[:taken]
                self.tokens[i].extend(run)
                emitted.append(run)
                finish.append(reason)
                step_logprobs.append(
                    [self._next_logprobs[i], *(logprobs[i, j] for j in range(taken - 1))]
                )
                next_tokens.append(got[n])
                next_logprobs.append(logprobs[i, n])
                if (grammar := masked[i]) is not None:
                    # Its processors skipped this pass: their context takes what it emitted.
                    self._token_context[i].update_and_fetch(mx.array(run, dtype=mx.int32))
                if draft:
                    forced = grammar.forced_kept(taken - 1) if grammar is not None else 0
                    verified.append(Verified(self.uids[i], len(draft), taken - 1, forced))

            self.verified = tuple(verified)
            trim_rows(self.prompt_cache, width, [len(run) for run in emitted])
            self._current_tokens = mx.array(pending, dtype=mx.uint32)  # type: ignore[assignment]  # mlx-lm annotates it None
            self._current_logprobs = self._next_logprobs
            self._next_tokens = mx.array(next_tokens, dtype=mx.uint32)
            self._next_logprobs = next_logprobs
            mx.async_eval(self._next_tokens, [c.state for c in self.prompt_cache])

            responses = []
            keep = []
            for i, (run, reason) in enumerate(zip(emitted, finish, strict=True)):
                if reason is None:
                    keep.append(i)
                for j, token in enumerate(run):
                    last = reason is not None and j == len(run) - 1
                    responses.append(
                        self.Response(
                            uid=self.uids[i],
                            token=token,
                            logprobs=step_logprobs[i][j],
                            finish_reason=reason if last else None,
                            prompt_cache=self.extract_cache(i) if last else None,
                            all_tokens=self.tokens[i] if last else None,
                        )
                    )
            if len(keep) < size:
                self.filter(keep)
            return responses

        def _row_samplers(self) -> list[Any]:
            given = self.samplers or [self.fallback_sampler] * len(self.uids)
            return [self.fallback_sampler if s is None else s for s in given]

        def _sample(self, scores: Any) -> list[list[int]]:
            """Each row's sample at every position of a verify pass, from ``scores`` (the
            logits, or their log-probabilities: ``sampler_scores``); a group's other ranks
            take rank 0's instead: ``router.worker.group``."""
            import mlx.core as mx

            size, width = scores.shape[:2]
            samplers = self._row_samplers()
            if all(s is samplers[0] for s in samplers):
                flat = samplers[0](scores.reshape(size * width, -1))
                sampled = flat.reshape(size, width)
            else:
                sampled = mx.stack([s(scores[e]) for e, s in enumerate(samplers)])
            return cast("list[list[int]]", sampled.tolist())  # (size, width) uint32

        def _processed(self, e: int, inputs: Any, row: Any) -> Any:
            """Row ``e``'s logits, its processors applied at its one real position."""
            import mlx.core as mx

            processors = (self.logits_processors or [[]] * (e + 1))[e]
            if not processors:
                return row
            context = self._token_context[e].update_and_fetch(inputs[e, :1])
            first = row[:1]
            for processor in processors:
                first = processor(context, first)
            return mx.concatenate([first, row[1:]])

    return DraftingBatch


def grammar_masked(grammar: Draft, logits: Any) -> Any:
    """A row's ``(width, vocab)`` logits under its grammar's masks: position ``j`` masked by
    row ``j`` (what the grammar allows after the pending token and ``j`` draft tokens);
    the padding after its draft is left as it is (never sampled from)."""
    import mlx.core as mx
    import numpy as np

    width, vocab = logits.shape
    rows = grammar.mask(vocab)
    allowed = np.ones((width, vocab), dtype=bool)
    allowed[: rows.shape[0]] = rows
    return mx.where(mx.array(allowed), logits, -mx.inf)


def drafting_generator(model: Any, drafter: Drafter, **options: Any) -> Any:
    """A ``BatchGenerator`` whose decoding sequences verify ``drafter``'s drafts."""
    from mlx_lm.generate import BatchGenerator

    generator = BatchGenerator(model, **options)
    batch: Any = batch_class()
    batch = batch.empty(model, generator.sampler)
    batch.drafter = drafter
    generator._generation_batch = batch
    return generator


def set_drafter(generator: Any, drafter: Drafter | None) -> None:
    """Draft with ``drafter`` from the next step on; None: mlx-lm's plain steps."""
    generator._generation_batch.drafter = drafter


def last_verified(generator: Any) -> list[Verified]:
    """The rows that verified a draft in the generator's last step."""
    return list(getattr(generator._generation_batch, "verified", ()))


def time_next_plain(generator: Any, wanted: bool) -> None:
    """Time the generator's next plain step (the lane has no plain figure for its batch size
    yet), not only one in ``PLAIN_TIMED_EVERY``."""
    generator._generation_batch.time_plain = wanted


def last_pass(generator: Any) -> tuple[int, int, float] | None:
    """The generator's last step's pass while its sequences draft (rows, width, seconds;
    timed to its result, so it does not overlap another step), or None (mlx-lm's own
    pipelined step: no sequence drafts)."""
    return getattr(generator._generation_batch, "timed", None)
