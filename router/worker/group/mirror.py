"""What a follower does with each message: the same cache operations and forward passes as
rank 0, on its own shard (``Shard``) and its own mirror of the prompt cache.

Every slot remembers the tokens its cache holds, so a ``STORE`` needs only a length and a
checksum, and a follower whose history differs from rank 0's stops the group (a
``ProtocolError``) rather than answer from a wrong cache.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

from router.worker.group.channel import Channel, disagree, gather_memory, own_rss_mib, receive
from router.worker.group.protocol import Message, Op, ProtocolError, checksum

log = logging.getLogger("speclane.worker.group")

MAX_SLOTS = 16  # a request uses one or two (its cache, a calibration pass's)
# Rank 0 sends IDLE every IDLE_TICK seconds while it has nothing to do; a follower sleeps most
# of a tick before it waits in the next collective, which spins a core while it waits
# (measured here: about 40% of one while idle). A request waits at most one tick to start.
IDLE_TICK = 0.1
IDLE_SLEEP = 0.085


class Shard(Protocol):
    """This rank's part of the target: its KV caches and its forward pass."""

    def fresh(self) -> Any: ...

    def forward(self, cache: Any, tokens: list[int]) -> None: ...

    def length(self, cache: Any) -> int: ...

    def trim(self, cache: Any, n: int) -> None: ...


class CacheMirror(Protocol):
    """The prompt cache's two operations (``router.worker.engines.promptcache.PromptCache``)."""

    def fetch(self, prompt: list[int], partition: str) -> Any: ...

    def store(self, tokens: list[int], cache: Any, partition: str) -> None: ...


class BatchOps(Protocol):
    """The batching lane's messages (``router.worker.group.batchmirror.BatchMirror``)."""

    def apply(self, message: Message) -> None: ...


@dataclass
class Slot:
    cache: Any
    tokens: list[int] = field(default_factory=list)


class Mirror:
    def __init__(
        self,
        shard: Shard,
        prompt_cache: CacheMirror,
        channel: Channel,
        idle_sleep: float = IDLE_SLEEP,
        alive: Callable[[], bool] = lambda: True,
        batch: BatchOps | None = None,
    ) -> None:
        self.batch = batch  # the batching lane's generator on this rank (both lanes served)
        self.idle_sleep = idle_sleep
        self.alive = alive  # False once this rank's launcher is gone (checked when idle)
        self.idles = 0
        self.shard = shard
        self.prompt_cache = prompt_cache
        self.channel = channel
        self.slots: dict[int, Slot] = {}
        self.passes = 0

    def apply(self, message: Message) -> bool:
        """Carry out one message; False once told to stop."""
        op = message.op
        if op is Op.STOP:
            return False
        if op is Op.IDLE:
            self.idles += 1
            if not self.alive():  # where no signal tells us (no PDEATHSIG off Linux)
                raise ProtocolError("this rank's launcher is gone")
            time.sleep(self.idle_sleep)
        elif op is Op.END:
            self.slots.clear()
        elif op.name.startswith("BATCH_"):
            if self.batch is None:
                raise ProtocolError(f"{op.name}, but this rank serves no batching lane")
            self.batch.apply(message)
        elif op is Op.MEMORY:
            gather_memory(self.channel, own_rss_mib())
        elif op is Op.NEW:
            self._put(message.slot, Slot(self.shard.fresh()))
        elif op is Op.FETCH:
            self._fetch(message)
        elif op is Op.FORWARD:
            slot = self._slot(message)
            self._back_to(slot, message.offset)
            tokens = list(message.tokens)
            self.shard.forward(slot.cache, tokens)
            slot.tokens += tokens
            self.passes += 1
        elif op is Op.STORE:
            slot = self._slot(message)
            self._back_to(slot, message.offset)
            if checksum(slot.tokens) != message.checksum:
                raise ProtocolError("this rank's history differs from rank 0's")
            self.prompt_cache.store(slot.tokens, slot.cache, message.partition)
        return True

    def _fetch(self, message: Message) -> None:
        tokens = list(message.tokens)
        lookup = self.prompt_cache.fetch(tokens, message.partition)
        cached = lookup.cached_tokens
        cache = lookup.cache
        # offset: the length rank 0 found; any rank that found another starts all afresh
        if disagree(self.channel, cached != message.offset):
            cache, cached = None, 0
        self._put(
            message.slot, Slot(cache if cache is not None else self.shard.fresh(), tokens[:cached])
        )

    def _put(self, key: int, slot: Slot) -> None:
        if key not in self.slots and len(self.slots) >= MAX_SLOTS:
            raise ProtocolError(f"more than {MAX_SLOTS} caches open at once")
        self.slots[key] = slot

    def _slot(self, message: Message) -> Slot:
        slot = self.slots.get(message.slot)
        if slot is None:
            raise ProtocolError(f"{message.op.name} on slot {message.slot}, which is not open")
        return slot

    def _back_to(self, slot: Slot, offset: int) -> None:
        have = self.shard.length(slot.cache)
        if offset > have or offset > len(slot.tokens):
            raise ProtocolError(f"rank 0's cache holds {offset} positions, this rank's {have}")
        if have > offset:
            self.shard.trim(slot.cache, have - offset)
        del slot.tokens[offset:]


def follow(mirror: Mirror) -> int:
    """Carry out rank 0's messages until it says stop; 0 then. A broken group raises."""
    while True:
        message = receive(mirror.channel)
        if not mirror.apply(message):
            log.info("rank %d: told to stop after %d passes", mirror.channel.rank, mirror.passes)
            return 0
