"""Rank 0: the speculative lane's engine over a group of ranks.

``GroupModel`` stands in for the target everywhere the lane calls it (``decode``,
``prefill_chunks``, a calibration pass): before each pass it sends ``FORWARD`` with the
cache's slot, its length and the tokens, then runs its own shard and evaluates the whole
output, so every rank runs every collective of the pass in the same order. The engine's
prompt-cache lookups and stores of the target go through ``FETCH`` / ``STORE``; the draft
model's cache stays on rank 0 alone (a separate cache, so that the target's mirrors on every
rank see exactly the same entries and evict alike). Sampling, drafting, stop strings and
everything else of the lane run on rank 0 only: the target's logits after a tensor-parallel
pass are the same on every rank.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from router.worker.engines.engine import Models
from router.worker.engines.jobs import Job, JobQueue
from router.worker.engines.promptcache import DRAFT, TARGET, PromptCache, Segment
from router.worker.engines.speculative import SpeculativeConfig, SpeculativeEngine
from router.worker.group.channel import Channel, disagree, gather_memory, own_rss_mib, send
from router.worker.group.mirror import IDLE_TICK
from router.worker.group.protocol import Message, Op, checksum
from router.worker.group.shard import cache_length

log = logging.getLogger("speclane.worker.group")


@dataclass(frozen=True)
class GroupFacts:
    """What /health reports of the group."""

    hosts: tuple[str, ...]
    backend: str
    parallel: str


class Leader:
    """Rank 0's side of the op log: which slot each of its caches is."""

    def __init__(self, channel: Channel) -> None:
        self.channel = channel
        self._slots: dict[int, tuple[int, Any]] = {}  # id(cache) -> (slot, the cache itself)
        self._next = 0
        self.messages = 0
        self.rank_memory_mib: list[int] = []  # every rank's resident memory, last gathered

    def send(self, message: Message) -> None:
        send(self.channel, message)
        self.messages += 1

    def slot_of(self, cache: Any) -> int:
        """The slot of ``cache``; a cache rank 0 made itself opens a fresh one (NEW)."""
        known = self._slots.get(id(cache))
        if known is not None:
            return known[0]
        slot = self._open(cache)
        self.send(Message(Op.NEW, slot))
        return slot

    def _open(self, cache: Any) -> int:
        slot = self._next
        self._next += 1
        self._slots[id(cache)] = (slot, cache)  # held: its id cannot be reused meanwhile
        return slot

    def fetch(
        self,
        prompt_cache: PromptCache,
        fresh: Callable[[], Any],
        tokens: list[int],
        partition: str,
        counters: Any,
    ) -> tuple[Any, int]:
        """The prompt cache's nearest entry for ``tokens``, on every rank alike."""
        lookup = prompt_cache.fetch(tokens, partition, model=TARGET, counters=counters)
        cache, cached = lookup.cache, lookup.cached_tokens
        slot = self._next  # opened below, whatever the agreement
        self.send(Message(Op.FETCH, slot, cached, tuple(tokens), partition))
        if disagree(self.channel, False):  # a rank's mirror found another length
            log.warning("the ranks' prompt caches differ; this request starts from scratch")
            cache, cached = None, 0
        if cache is None:
            cache = fresh()
        self._open(cache)
        return cache, cached

    def store(
        self, prompt_cache: PromptCache, tokens: list[int], cache: Any, partition: str
    ) -> None:
        slot = self.slot_of(cache)
        self.send(Message(Op.STORE, slot, len(tokens), (), partition, checksum(tokens)))
        prompt_cache.store(tokens, cache, partition, model=TARGET)

    @property
    def open(self) -> bool:
        """Some cache of a request is open on every rank (``end`` closes them)."""
        return bool(self._slots)

    def end(self) -> None:
        self._slots.clear()
        self.send(Message(Op.END))

    def stop(self) -> None:
        self.send(Message(Op.STOP))

    def idle(self) -> None:
        send(self.channel, Message(Op.IDLE))  # not counted: it says nothing happened

    def gather_memory(self) -> None:
        self.send(Message(Op.MEMORY))
        self.rank_memory_mib = gather_memory(self.channel, own_rss_mib())


class GroupModel:
    """The target as the lane sees it: each call is announced to the group, then run."""

    def __init__(self, model: Any, leader: Leader) -> None:
        self._model = model
        self._leader = leader

    def __call__(self, inputs: Any, cache: Any = None, **kwargs: Any) -> Any:
        import mlx.core as mx

        if cache is None:
            raise ValueError("a group's passes run on a KV cache")
        slot = self._leader.slot_of(cache)
        tokens = tuple(int(t) for t in inputs.reshape(-1).tolist())
        self._leader.send(Message(Op.FORWARD, slot, cache_length(cache), tokens))
        out = self._model(inputs, cache=cache, **kwargs)
        mx.eval(out)  # now: every rank's collectives of this pass before the next message
        return out

    def __getattr__(self, name: str) -> Any:
        return getattr(self._model, name)


def exit_unless_left(left: bool) -> None:
    """After rank 0's engine stopped: if the other ranks were not told to stop, they wait in
    a collective we can no longer pair; exit non-zero so that mlx.launch ends them (it does
    so only when a rank fails)."""
    if not left:
        log.error("the group could not be told to stop; exiting so mlx.launch ends it")
        os._exit(1)


class GroupSpecEngine(SpeculativeEngine):
    """The speculative lane with its target spread over a group (rank 0's side)."""

    # Its passes are the group's: timed when a request first could use the draft model,
    # while the other ranks follow the request's steps.
    calibrates_at_start = False

    def __init__(
        self,
        load: Callable[[], Models],
        settings: SpeculativeConfig,
        channel: Channel,
        facts: GroupFacts,
        *,
        prompt_cache: PromptCache | None = None,
        queue: JobQueue | None = None,
    ) -> None:
        self.leader = Leader(channel)
        self.facts = facts
        self.left = False  # the other ranks were told to stop
        super().__init__(
            lambda: self._wrap(load()), settings, prompt_cache=prompt_cache, queue=queue
        )
        # the draft model's KV state: rank 0's alone, kept apart from the target's mirrors
        self.draft_cache = PromptCache(settings.prompt_cache_bytes)

    def _wrap(self, models: Models) -> Models:
        return Models(GroupModel(models.model, self.leader), models.tokenizer, models.draft)

    def report(self) -> dict[str, object]:
        report = super().report()
        report["group"] = self.group_report()
        return report

    def group_report(self) -> dict[str, object]:
        return {
            "ranks": self.leader.channel.size,
            "hosts": list(self.facts.hosts),
            "backend": self.facts.backend,
            "parallel": self.facts.parallel,
            "messages": self.leader.messages,
            "rank_memory_bytes": [mib << 20 for mib in self.leader.rank_memory_mib],
        }

    def fetch(
        self, key: str, model: Any, tokens: list[int], partition: str
    ) -> tuple[list[Any], int]:
        from mlx_lm.models.cache import make_prompt_cache

        if key != TARGET:
            lookup = self.draft_cache.fetch(tokens, partition, model=key)
            if lookup.cache is None:
                return make_prompt_cache(model), 0
            return lookup.cache, lookup.cached_tokens
        return self.leader.fetch(
            self.prompt_cache,
            lambda: make_prompt_cache(model),
            tokens,
            partition,
            self.cache_counters,
        )

    def store(
        self,
        key: str,
        tokens: list[int],
        cache: list[Any],
        partition: str,
        segments: tuple[Segment, ...] = (),
    ) -> None:
        # No segment entries over a group: every rank's cache must hold the same entries,
        # and the followers' mirrors store whole sequences only.
        if key == DRAFT:
            self.draft_cache.store(tokens, cache, partition, model=key)
        else:
            self.leader.store(self.prompt_cache, tokens, cache, partition)

    def _next_job(self) -> Job | None:
        """The next job (None: closed); meanwhile the other ranks sleep between ticks."""
        while (job := self._queue.get(block=False)) is None:
            if self._queue.closed:
                return None
            self.leader.idle()
            self._queue.wait(IDLE_TICK)
        return job

    def _serve(self, models: Models) -> None:
        self.leader.gather_memory()
        while (job := self._next_job()) is not None:
            self._begin(models, job)
            while self.run is not None:
                self.round()
            self.leader.end()  # every slot of the request is closed on every rank
            self.leader.gather_memory()
        self.leader.stop()
        self.left = True

    def stop(self, timeout: float) -> None:
        super().stop(timeout)
        exit_unless_left(self.left)
