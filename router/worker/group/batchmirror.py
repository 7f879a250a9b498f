"""A follower's side of the batching lane: the same ``BatchGenerator`` calls as rank 0's, on
its own shard and its own mirror of the prompt cache (``protocol``'s ``BATCH_*`` ops).

The generator is mlx-lm's, so every change it makes to its batch caches (merging a
prompt's cache into the batch, right-padded prefill chunks, rows leaving) is the one rank 0's
makes; what it cannot compute alone is rank 0's sampling. Its decoding batch
(``MirrorBatch``) therefore takes each step's pending tokens and drafts from rank 0 before
the pass (``BATCH_STEP``) and, after a verify pass, rank 0's samples (``BATCH_SAMPLED``); its
own samples of a plain step are never used (the next step's pending tokens replace them).
Rows finish where rank 0's do: the same tokens against the same ``max_tokens`` and EOS.
A stored or removed sequence's tokens are checked against rank 0's checksum: a rank whose
history differs stops the group (``ProtocolError``).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from functools import cache
from typing import Any

from router.worker.engines.batchverify import batch_class
from router.worker.group.channel import Channel, disagree, receive
from router.worker.group.protocol import (
    Message,
    Op,
    ProtocolError,
    checksum,
    pairs,
    parse_sampled,
    parse_step,
)

log = logging.getLogger("speclane.worker.group")

MAX_SEQUENCES = 1024  # sequences in the batch at once: far above any lane's capacity
MAX_PREFILL_STEP = 1 << 20


@cache
def mirror_batch_class() -> type:
    """``MirrorBatch``: a follower's decoding batch, made on first use."""
    from mlx_lm.generate import GenerationBatch

    class MirrorBatch(batch_class()):  # type: ignore[misc]
        channel: Channel

        def next(self) -> list[Any]:
            import mlx.core as mx

            if not self.uids:
                return []
            uids, pending, drafts = parse_step(receive(self.channel))
            if uids != list(self.uids):
                raise ProtocolError(f"rank 0's batch holds {uids}, this rank's {list(self.uids)}")
            self._next_tokens = mx.array(pending, dtype=mx.uint32)
            if any(drafts):
                return list(self._verify(pending, drafts))
            return list(GenerationBatch.next(self))

        def _sample(self, scores: Any) -> list[list[int]]:
            rows, width = int(scores.shape[0]), int(scores.shape[1])
            return parse_sampled(receive(self.channel), rows, width)

    return MirrorBatch


class BatchMirror:
    """Carries out the ``BATCH_*`` messages on this rank's generator."""

    def __init__(
        self, make_generator: Callable[[], Any], prompt_cache: Any, channel: Channel
    ) -> None:
        self.make_generator = make_generator  # a fresh generator, its batch told the channel
        self.prompt_cache = prompt_cache
        self.channel = channel
        self.generator: Any = None
        self.partitions: dict[int, str] = {}  # uid -> its request's prompt-cache partition
        self.finished: dict[int, tuple[list[int], Any]] = {}  # the last step's, till stored
        self.steps = 0

    def apply(self, message: Message) -> None:
        op = message.op
        if op is Op.BATCH_RESET:
            self._reset()
        elif op is Op.BATCH_INSERT:
            self._insert(message)
        elif op is Op.BATCH_NEXT:
            self._next(message)
        elif op is Op.BATCH_STORE:
            self._store(message)
        elif op is Op.BATCH_REMOVE:
            self._remove(message)
        else:
            raise ProtocolError(f"{op.name} outside a batch step")

    def _gen(self, op: Op) -> Any:
        if self.generator is None:
            raise ProtocolError(f"{op.name} before the batch was opened")
        return self.generator

    def _reset(self) -> None:
        if self.generator is not None:
            self.generator.close()
        self.generator = self.make_generator()
        self.partitions.clear()
        self.finished.clear()

    def _insert(self, message: Message) -> None:
        generator = self._gen(message.op)
        tokens = list(message.tokens)
        lookup = self.prompt_cache.fetch(tokens, message.partition)
        cache, cached = lookup.cache, lookup.cached_tokens
        # offset: the length rank 0 found; any rank that found another starts all afresh
        if disagree(self.channel, cached != message.offset):
            cache, cached = None, 0
        if len(self.partitions) >= MAX_SEQUENCES:
            raise ProtocolError(f"more than {MAX_SEQUENCES} sequences in the batch")
        try:
            (uid,) = generator.insert(
                [tokens[cached:]],
                max_tokens=[message.value],
                caches=[cache],
                all_tokens=[tokens[:cached]],
            )
        except ValueError:
            return  # rank 0's generator refused the same prompt (and answered it 400)
        if uid != message.slot:
            raise ProtocolError(f"rank 0 inserted sequence {message.slot}, this rank {uid}")
        self.partitions[uid] = message.partition

    def _next(self, message: Message) -> None:
        generator = self._gen(message.op)
        if not 0 < message.value <= MAX_PREFILL_STEP:
            raise ProtocolError(f"a prefill step of {message.value} tokens")
        for uid in self.finished:  # finished without being stored: rank 0 forgot it too
            self.partitions.pop(uid, None)
        self.finished.clear()
        generator.prefill_step_size = message.value
        _, responses = generator.next()
        self.steps += 1
        for response in responses:
            if response.finish_reason is not None:
                self.finished[response.uid] = (list(response.all_tokens), response.prompt_cache)

    def _store(self, message: Message) -> None:
        entry = self.finished.pop(message.slot, None)
        if entry is None:
            raise ProtocolError(f"sequence {message.slot} did not finish on this rank")
        tokens, cache = entry
        if checksum(tokens) != message.checksum:
            raise ProtocolError("this rank's history differs from rank 0's")
        self.prompt_cache.store(tokens, cache, self.partitions.pop(message.slot, ""))

    def _remove(self, message: Message) -> None:
        generator = self._gen(message.op)
        wanted = pairs(message)
        keep = message.value == 1
        caches = generator.remove([uid for uid, _ in wanted], return_prompt_caches=keep)
        for uid, sums in wanted:
            partition = self.partitions.pop(uid, "")
            if (entry := caches.get(uid)) is None:
                continue
            cache, tokens = entry
            if checksum(tokens) != sums:
                raise ProtocolError("this rank's history differs from rank 0's")
            self.prompt_cache.store(tokens, cache, partition)
