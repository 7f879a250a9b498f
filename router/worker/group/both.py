"""Rank 0 serving both lanes over a group: the shared layout's one generation thread
(``router.worker.engines.shared``, one thread taking turns), its speculative lane a
``GroupSpecEngine`` and its batching lane a ``GroupBatchingEngine``, on one copy of the
model split between the ranks and one prompt cache (mirrored on every rank).

One thread runs every pass of both engines, so their messages form one op log in the order
the passes run, and every other rank carries them out in that order (``mirror.follow``).
Turns as in the shared layout: one speculative round, then one batch step. Around them, as
the speculative lane alone over a group does: ``END`` after each speculative request (its
slots close on every rank), every rank's memory gathered when work ends, ``IDLE`` ticks
while there is none, ``STOP`` when the worker stops.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from router.worker.engines.engine import Models
from router.worker.engines.jobs import wait_any
from router.worker.engines.shared import SharedEngine, batch_drafts
from router.worker.engines.speculative import SpeculativeConfig
from router.worker.group.batchlead import GroupBatchingEngine
from router.worker.group.channel import Channel
from router.worker.group.leader import GroupFacts, GroupSpecEngine, exit_unless_left
from router.worker.group.mirror import IDLE_TICK

log = logging.getLogger("speclane.worker.group")


def _loaded_elsewhere() -> Models:
    raise RuntimeError("the shared engine loads the models")  # the lanes never load


class GroupSharedEngine(SharedEngine):
    def __init__(
        self,
        load: Callable[[], Models],
        settings: SpeculativeConfig,
        capacity: int,
        *,
        channel: Channel,
        facts: GroupFacts,
        prompt_cache_bytes: int,
        prefill_step_size: int,
        chunk_seconds: float,
    ) -> None:
        super().__init__(
            load,
            settings,
            capacity,
            prompt_cache_bytes=prompt_cache_bytes,
            prefill_step_size=prefill_step_size,
            chunk_seconds=chunk_seconds,
            threads=1,
        )
        # The group's lanes in place of the plain ones, on the same queues and prompt cache.
        self.speculative = self.group_spec = GroupSpecEngine(
            _loaded_elsewhere,
            settings,
            channel,
            facts,
            prompt_cache=self.prompt_cache,
            queue=self.speculative.queue,
        )
        self.leader = self.group_spec.leader
        self.batching = GroupBatchingEngine(
            _loaded_elsewhere,
            capacity,
            self.leader,
            whole=facts.parallel == "pipeline",
            prefill_step_size=prefill_step_size,
            chunk_seconds=chunk_seconds,
            prompt_cache=self.prompt_cache,
            queue=self.batching.queue,
            drafts=batch_drafts(settings),
        )
        self.left = False  # the other ranks were told to stop

    def group_report(self) -> dict[str, object]:
        return self.group_spec.group_report()

    def _serve(self, models: Models) -> None:
        spec, batch, leader = self.group_spec, self.batching, self.leader
        spec_models: Any = spec._wrap(models)  # the speculative lane's passes: FORWARD
        queues = [spec.queue, batch.queue]
        leader.gather_memory()
        batch.open_batch(models)
        gathered = True
        while True:
            if spec.take(spec_models):
                spec.round()
                self.turns["speculative"] += 1
            if spec.run is None and leader.open:
                leader.end()  # every slot of the request is closed on every rank
            batch.admit(models)
            if batch.busy:
                batch.step(models, others_waiting=spec.busy)
                self.turns["batching"] += 1
            if spec.busy or batch.busy:
                gathered = False
                continue
            if all(q.closed for q in queues):
                break
            if not gathered:
                leader.gather_memory()
                gathered = True
            leader.idle()
            wait_any(queues, IDLE_TICK)
        batch.close_batch()
        leader.stop()
        self.left = True

    def stop(self, timeout: float) -> None:
        super().stop(timeout)
        exit_unless_left(self.left)
