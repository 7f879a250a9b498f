"""Shared mode: both lanes in one process, on one copy of the model and the draft.

One generation thread runs the speculative lane's ``SpeculativeEngine`` and the batching
lane's ``BatchingEngine``, taking turns:

- the speculative lane's turn: one round of its running request, i.e. one draft-and-verify
  step, or one ``PREFILL_STEP`` chunk of a long prompt (``SpecRun.advance``);
- the batching lane's turn: one ``BatchGenerator.next()``, i.e. one decoding step of the
  running sequences plus at most one prefill chunk per prompt being prefilled, a chunk being
  sized to ``prefill_chunk_seconds`` (``BatchingEngine.step``; never the larger chunk of a
  batch that only prefills while a speculative request waits).

Fairness rule: a speculative request waits at most one batch step (one decoding step and one
prefill chunk) between two of its rounds, and the batch waits at most one speculative round
between two of its steps, however many speculative requests queue up. A lane with nothing to
do gives its turn away; with nothing to do in either, the thread sleeps until a job arrives.

Both lanes keep their own queues, cancel flags and figures (``/lanes/<lane>/health``); they
share the model, the draft and one prompt cache (one byte budget), so a prefix cached through
one lane is found by the other.

Seeds: ``mx.random.seed`` is global, so a seeded request is reproducible only while the other
lane is idle.
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Callable

from router.worker.batching import BatchingEngine
from router.worker.engine import Engine, LoadError, Models
from router.worker.jobs import JobQueue, wait_any
from router.worker.promptcache import PromptCache
from router.worker.speculative import SpecSettings, SpeculativeEngine

log = logging.getLogger("speclane.worker")


def _loaded_elsewhere() -> Models:
    raise RuntimeError("the shared engine loads the models")  # the lanes never load


class SharedEngine:
    def __init__(
        self,
        load: Callable[[], Models],
        settings: SpecSettings,
        capacity: int,
        *,
        prompt_cache_bytes: int,
        prefill_step_size: int,
        chunk_seconds: float,
    ) -> None:
        self._load = load
        cond = threading.Condition()  # one for both queues: the thread sleeps on either
        self.prompt_cache = PromptCache(prompt_cache_bytes)
        self.speculative = SpeculativeEngine(
            _loaded_elsewhere, settings, prompt_cache=self.prompt_cache, queue=JobQueue(cond)
        )
        self.batching = BatchingEngine(
            _loaded_elsewhere,
            capacity,
            prefill_step_size=prefill_step_size,
            chunk_seconds=chunk_seconds,
            prompt_cache=self.prompt_cache,
            queue=JobQueue(cond),
        )
        self.models: Models | None = None
        self.turns = {"speculative": 0, "batching": 0}  # turns taken per lane (monotonic)
        self._load_error: BaseException | None = None
        self._loaded = threading.Event()
        self._thread = threading.Thread(target=self._main, name="generation", daemon=True)

    @property
    def lanes(self) -> dict[str, Engine]:
        return {"speculative": self.speculative, "batching": self.batching}

    def start(self) -> Models:
        """Start the thread and wait until it has loaded the models (or failed to)."""
        self._thread.start()
        self._loaded.wait()
        if self.models is None:
            raise LoadError(str(self._load_error) or type(self._load_error).__name__)
        return self.models

    def stop(self, timeout: float) -> None:
        for lane in self.lanes.values():
            lane.close()
        self._thread.join(timeout)

    def _main(self) -> None:
        try:
            self.models = self._load()
        except BaseException as e:  # reported by start(); the process exits non-zero
            self._load_error = e
        finally:
            if self.models is not None:
                self.speculative.models = self.batching.models = self.models
            self._loaded.set()
        if self.models is None:
            return
        try:
            self._serve(self.models)
        except BaseException:
            # Both lanes would hang behind a live HTTP side: exit, so the supervisor restarts.
            log.exception("the generation thread failed; exiting")
            logging.shutdown()
            os._exit(1)

    def _serve(self, models: Models) -> None:
        spec, batch = self.speculative, self.batching
        queues = [spec.queue, batch.queue]
        batch.open_batch(models)
        while True:
            if spec.take(models):
                spec.round()
                self.turns["speculative"] += 1
            batch.admit(models)
            if batch.busy:
                batch.step(models, others_waiting=spec.busy)
                self.turns["batching"] += 1
            if spec.busy or batch.busy:
                continue
            if all(q.closed for q in queues):
                break
            wait_any(queues)
        batch.close_batch()
