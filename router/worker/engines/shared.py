"""Shared mode: both lanes in one process, on one copy of the model and the draft.

Two ways to run the two engines (``--shared-threads``, ``threads_for``):

- **two threads** (``2``; ``auto`` on a multi-core CPU with a one-thread BLAS, ``threads_for``):
  each lane's engine runs on its own generation thread, exactly as in a one-lane worker, so
  the lanes decode at the same time on two cores. MLX (>= 0.31.2) is thread-safe, and each
  thread evaluates on its own default stream (mlx-lm's ``generation_stream`` is
  thread-local), but a lazy array made on one thread cannot be evaluated on another. So
  whatever crosses is evaluated first:
  the weights when loaded (``materialize``), and a KV state before it enters the prompt cache
  (``PromptCache.store``); the prompt cache itself is locked, and an entry is only ever
  copied out, never changed in place. Fairness: neither lane waits for the other's rounds
  or steps; they share the cores (the operating system's scheduler) and the prompt cache's
  lock, held for a lookup or an insertion, never for a forward pass. The batch's prefill
  chunks keep their one-lane sizes.
- **one thread taking turns** (``1``; ``auto`` otherwise: a GPU, one device both lanes share
  anyway; a multi-threaded BLAS, which already spreads one thread's work over the cores; one
  core), described below.

With one thread, the generation thread runs the speculative lane's ``SpeculativeEngine`` and
the batching lane's ``BatchingEngine``, taking turns:

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

Seeds: MLX keeps one random key per thread. With two threads a lane's seed is its own (as
in a one-lane worker); with one thread it is shared, so a seeded request is reproducible
only while the other lane is idle.
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Callable
from typing import Any

from router.kernel.errors import LoadError
from router.kernel.worker_contract import SHARED_THREADS
from router.worker.drafting.draftlength import BatchDraftSettings
from router.worker.engines.batching import BatchingEngine
from router.worker.engines.engine import Engine, Models
from router.worker.engines.jobs import JobQueue, wait_any
from router.worker.engines.promptcache import PromptCache
from router.worker.engines.speculative import SpeculativeConfig, SpeculativeEngine

log = logging.getLogger("speclane.worker")


def _loaded_elsewhere() -> Models:
    raise RuntimeError("the shared engine loads the models")  # the lanes never load


def threads_for(
    choice: str, cpu_count: int | None, on_cpu: bool, blas_threads: str | None = None
) -> int:
    """Generation threads of the shared worker (pure): ``auto`` gives each lane its own thread
    only where that pays: a CPU with two cores or more whose BLAS runs one thread per call
    (``blas_threads``: ``OPENBLAS_NUM_THREADS``, "1"). A multi-threaded BLAS already spreads
    one thread's work over the cores, and two lanes computing at once then compete for them
    (measured: no more aggregate throughput, a slower speculative stream); a GPU is one
    device shared either way."""
    if choice not in SHARED_THREADS:
        raise ValueError(f"shared threads must be one of {', '.join(SHARED_THREADS)}")
    if choice != "auto":
        return int(choice)
    return 2 if on_cpu and (cpu_count or 1) >= 2 and blas_threads == "1" else 1


def materialize(models: Models) -> None:
    """Evaluate every array the models hold, parameters and the rest (a RoPE's frequencies,
    say): a lazy array made on the loading thread cannot be evaluated on another."""
    import mlx.core as mx

    def every_array(module: Any, key: str, value: Any) -> bool:
        return isinstance(value, dict | list | mx.array)  # parameters() skips "_" keys

    mx.eval([m.filter_and_map(every_array) for m in (models.model, models.draft) if m is not None])


def batch_drafts(settings: SpeculativeConfig) -> BatchDraftSettings:
    """The batching lane's draft limits, the speculative lane's (the router names each
    request's source, so the lane has none of its own)."""
    return BatchDraftSettings(
        lookup=settings.lookup,
        prediction=settings.prediction,
        suffix=settings.suffix,
        draft_position_cost=settings.draft_position_cost,
    )


class SharedEngine:
    def __init__(
        self,
        load: Callable[[], Models],
        settings: SpeculativeConfig,
        capacity: int,
        *,
        prompt_cache_bytes: int,
        prefill_step_size: int,
        chunk_seconds: float,
        threads: int = 1,
        prompt_cache: PromptCache | None = None,
    ) -> None:
        if threads not in (1, 2):
            raise ValueError("threads must be 1 or 2")
        self._load = load
        self.threads = threads
        # One thread: one condition for both queues, so it sleeps on either. Two threads:
        # one each (a notify on a shared one could wake the other lane's thread instead).
        cond = threading.Condition() if threads == 1 else None
        # ``prompt_cache``: one made by the caller (with a disk tier), else one of that size.
        self.prompt_cache = (
            prompt_cache if prompt_cache is not None else PromptCache(prompt_cache_bytes)
        )
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
            drafts=batch_drafts(settings),
        )
        self.models: Models | None = None
        self.turns = {"speculative": 0, "batching": 0}  # turns taken per lane (monotonic)
        self._load_error: BaseException | None = None
        self._loaded = threading.Event()
        self._thread = threading.Thread(target=self._main, name="generation", daemon=True)
        self._batch_thread: threading.Thread | None = None  # two threads: the batching lane's

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
        if self._batch_thread is not None:
            self._batch_thread.join(timeout)

    def _main(self) -> None:
        try:
            self.models = self._load()
            if self.threads == 2:
                materialize(self.models)
        except BaseException as e:  # reported by start(); the process exits non-zero
            self._load_error = e
        finally:
            if self.models is not None:
                self.speculative.models = self.batching.models = self.models
            self._loaded.set()
        if self.models is None:
            return
        if self.threads == 1:
            self._guarded(self._serve, self.models)
            return
        self._batch_thread = threading.Thread(
            target=self._guarded,
            args=(self._serve_batching, self.models),
            name="generation-batching",
            daemon=True,
        )
        self._batch_thread.start()
        self._guarded(self._serve_speculative, self.models)

    @staticmethod
    def _guarded(serve: Callable[[Models], None], models: Models) -> None:
        try:
            serve(models)
        except BaseException:
            # Both lanes would hang behind a live HTTP side: exit, so the supervisor restarts.
            log.exception("a generation thread failed; exiting")
            logging.shutdown()
            os._exit(1)

    # --- two threads: each lane on its own ----------------------------------------------------

    def _serve_speculative(self, models: Models) -> None:
        spec = self.speculative
        spec.calibrate_at_start(models)
        while spec.queue.wait():
            while spec.take(models):
                spec.round()
                self.turns["speculative"] += 1

    def _serve_batching(self, models: Models) -> None:
        batch = self.batching
        batch.open_batch(models)
        while True:
            batch.admit(models, block=not batch.busy)  # idle: sleep until work or shutdown
            if not batch.busy and batch.queue.closed:
                break
            if batch.busy:
                batch.step(models)
                self.turns["batching"] += 1
        batch.close_batch()

    # --- one thread taking turns -----------------------------------------------------------

    def _serve(self, models: Models) -> None:
        spec, batch = self.speculative, self.batching
        queues = [spec.queue, batch.queue]
        spec.calibrate_at_start(models)
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
