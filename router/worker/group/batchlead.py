"""Rank 0: the batching lane's engine over a group of ranks.

``GroupBatchingEngine`` is the batching lane (``router.worker.engines.batching``) whose generator is
the group's (``batchgen``): before each ``BatchGenerator`` call that changes the batch's KV
caches, it tells the other ranks (``protocol``'s ``BATCH_*`` ops), which make the same call
on their own generator (``batchmirror``). Its decoding batch (``LeaderBatch``) sends each
step's pending tokens and drafts before the pass and, after a verify pass, rank 0's samples:
the other ranks never sample, so their rows hold exactly rank 0's tokens. Prompt-cache
lookups are agreed on as the speculative lane's (``FETCH``): any rank whose mirror found
another length makes every rank start that prompt from scratch.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import cache
from typing import Any

from router.worker.engines.batching import BatchingEngine
from router.worker.engines.batchverify import RowDraft, batch_class, tokens_of
from router.worker.engines.engine import Models
from router.worker.engines.jobs import Job
from router.worker.engines.promptcache import Lookup
from router.worker.group.batchgen import SyncModel, generator_options, group_generator
from router.worker.group.channel import disagree
from router.worker.group.leader import Leader
from router.worker.group.protocol import Message, Op, checksum, step_data


@cache
def leader_batch_class() -> type:
    """``LeaderBatch``: the decoding batch of rank 0, made on first use."""

    class LeaderBatch(batch_class()):  # type: ignore[misc]
        leader: Leader

        def _announce(self, pending: list[int], drafts: list[list[int]]) -> None:
            data = step_data(list(self.uids), pending, drafts)
            self.leader.send(Message(Op.BATCH_STEP, slot=len(self.uids), tokens=data))

        def _step(self) -> Any:
            pending = [int(t) for t in self._next_tokens.tolist()]
            self._announce(pending, [[] for _ in pending])
            return super()._step()

        def _verify(self, pending: list[int], fitting: list[RowDraft]) -> Any:
            self._announce(pending, [tokens_of(d) for d in fitting])
            return super()._verify(pending, fitting)

        def _sample(self, scores: Any) -> list[list[int]]:
            rows = super()._sample(scores)
            width = len(rows[0]) if rows else 0
            flat = tuple(int(t) for row in rows for t in row)
            self.leader.send(Message(Op.BATCH_SAMPLED, slot=len(rows), offset=width, tokens=flat))
            return rows

    return LeaderBatch


class GroupBatchingEngine(BatchingEngine):
    """The batching lane with its target spread over a group (rank 0's side)."""

    def __init__(
        self,
        load: Callable[[], Models],
        capacity: int,
        leader: Leader,
        *,
        whole: bool = False,
        **options: Any,
    ) -> None:
        super().__init__(load, capacity, **options)
        self.leader = leader
        self.whole = whole  # evaluate every pass whole (a pipeline split: ``SyncModel``)

    def _new_generator(self, models: Models) -> Any:
        self.leader.send(Message(Op.BATCH_RESET))
        leader = self.leader
        options = generator_options(
            self.capacity, list(models.tokenizer.eos_token_ids), self.prefill_step_size
        )
        generator = group_generator(
            SyncModel(models.model, self.whole), leader_batch_class(), self._propose, **options
        )
        generator._generation_batch.leader = leader
        generator.before_next = lambda step: leader.send(Message(Op.BATCH_NEXT, value=step))
        return generator

    def _lookup(self, job: Job, prompt: list[int]) -> Lookup:
        lookup = super()._lookup(job, prompt)
        uid = int(self._generator._uid_count)  # the uid insert() gives next
        self.leader.send(
            Message(
                Op.BATCH_INSERT,
                slot=uid,
                offset=lookup.cached_tokens,
                tokens=tuple(prompt),
                partition=job.partition,
                value=job.request.budget,
            )
        )
        if disagree(self.leader.channel, False):  # a rank's mirror found another length
            return Lookup(None, 0, prompt)
        return lookup

    def _keep(self, uid: int, tokens: list[int], cache: Any, job: Job) -> None:
        self.leader.send(Message(Op.BATCH_STORE, slot=uid, checksum=checksum(tokens)))
        # whole sequences only, as the followers' mirrors store them (no segment entries)
        self.prompt_cache.store(tokens, cache, job.partition)

    def _remove(self, generator: Any, live: dict[int, Any], uids: list[int]) -> None:
        keep = self.prompt_cache.enabled
        caches = generator.remove(uids, return_prompt_caches=keep)
        kept = [(uid, checksum(tokens)) for uid, (_, tokens) in caches.items()]
        rest = [(uid, 0) for uid in uids if uid not in caches]
        data = tuple(v for pair in (*kept, *rest) for v in pair)
        self.leader.send(Message(Op.BATCH_REMOVE, tokens=data, value=int(keep)))
        for uid, (kv, tokens) in caches.items():
            self.prompt_cache.store(tokens, kv, live[uid].job.partition)
