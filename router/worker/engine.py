"""The generation thread: every model load and forward pass happens on it, nowhere else.

Two engines share the plumbing (a job queue in, events out, a cancel flag read every step):

- ``SpeculativeEngine`` (``router.worker.speculative``) runs one request at a time through its
  own draft-and-verify loop, with a draft model, prompt lookup or the request's prediction.
- ``BatchingEngine`` feeds ``mlx_lm.generate.BatchGenerator``: requests join the running batch
  between decoding steps, up to ``capacity`` sequences; the rest wait in the queue.

Seeds: ``mx.random.seed`` is global. On the speculative lane a seeded request is reproducible;
on the batching lane the seed is applied when the request joins the batch, so it is only
reproducible while the request decodes alone.
"""

from __future__ import annotations

import logging
import threading
from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from router.errors import RouterError
from router.worker.jobs import Event, Failed, Finished, Job, JobQueue, TextDelta, aborted
from router.worker.protocol import GenerationRequest
from router.worker.stats import SpecCounter, usage
from router.worker.stops import StopScanner

log = logging.getLogger("speclane.worker")


@dataclass(frozen=True)
class Models:
    model: Any
    tokenizer: Any
    draft: Any | None = None


class LoadError(Exception):
    pass


def sampler_for(request: GenerationRequest) -> Callable[..., Any]:
    from mlx_lm.sample_utils import make_sampler

    return make_sampler(
        temp=request.temperature, top_p=request.top_p, min_p=request.min_p, top_k=request.top_k
    )


def processors_for(request: GenerationRequest) -> list[Callable[..., Any]]:
    from mlx_lm.sample_utils import make_logits_processors

    repetition = request.repetition_penalty
    return make_logits_processors(
        logit_bias=dict(request.logit_bias) or None,
        repetition_penalty=None if repetition == 1.0 else repetition,
        presence_penalty=request.presence_penalty or None,
        frequency_penalty=request.frequency_penalty or None,
    )


def generation_failed(error: Exception) -> Failed:
    return Failed(RouterError(500, f"generation failed: {error}", type="server_error"))


class Progress:
    """One job's output on the generation thread: stop strings, counting, events."""

    def __init__(self, job: Job, num_draft_tokens: int) -> None:
        self.job = job
        self.scanner = StopScanner(job.request.stop)
        self.counter = SpecCounter(num_draft_tokens, job.request.max_tokens)

    def token(self, text: str, from_draft: bool) -> bool:
        """Count one generated token and emit its text; True when a stop string completed."""
        self.counter.observe(from_draft)
        if out := self.scanner.feed(text):
            self.job.emit(TextDelta(out))
        return self.scanner.stopped

    def finish(self, reason: str) -> Event:
        if tail := self.scanner.flush():
            self.job.emit(TextDelta(tail))
        prompt = len(self.job.prompt_ids)
        return Finished(reason, usage(prompt, self.counter.tokens, self.counter.snapshot()))


class Engine(ABC):
    capacity: int

    def __init__(self, load: Callable[[], Models]) -> None:
        self._load = load
        self.models: Models | None = None
        self._queue = JobQueue()
        self._open: set[Job] = set()  # submitted and not yet answered
        self._lock = threading.Lock()
        self._loaded = threading.Event()
        self._load_error: BaseException | None = None
        self._thread = threading.Thread(target=self._main, name="generation", daemon=True)
        self.active = 0

    @property
    def queued(self) -> int:
        return len(self._queue)

    def start(self) -> Models:
        """Start the thread and wait until it has loaded the models (or failed to)."""
        self._thread.start()
        self._loaded.wait()
        if self.models is None:
            raise LoadError(str(self._load_error) or type(self._load_error).__name__)
        return self.models

    def submit(self, job: Job) -> None:
        with self._lock:
            self._open.add(job)
        try:
            self._queue.put(job)
        except RuntimeError as e:
            self._answer(job, Failed(RouterError(503, str(e), type="service_unavailable")))

    def cancel(self, job: Job) -> None:
        job.cancelled.set()
        if self._queue.remove(job):
            self._answer(job, aborted())

    def stop(self, timeout: float) -> None:
        for job in self._queue.close():
            self._answer(job, aborted())
        with self._lock:
            running = list(self._open)
        for job in running:
            job.cancelled.set()
        self._thread.join(timeout)

    def _answer(self, job: Job, event: Event) -> None:
        with self._lock:
            self._open.discard(job)
        job.emit(event)

    def _main(self) -> None:
        try:
            self.models = self._load()
        except BaseException as e:  # reported by start(); the process exits non-zero
            self._load_error = e
        finally:
            self._loaded.set()
        if self.models is not None:
            self._serve(self.models)

    @abstractmethod
    def _serve(self, models: Models) -> None: ...


@dataclass
class _Sequence:
    job: Job
    progress: Progress
    detokenizer: Any


class BatchingEngine(Engine):
    def __init__(self, load: Callable[[], Models], capacity: int) -> None:
        super().__init__(load)
        self.capacity = capacity

    def _serve(self, models: Models) -> None:
        generator = self._new_generator(models)
        live: dict[int, _Sequence] = {}
        while True:
            self._admit(models, generator, live)
            self._drop_cancelled(generator, live)
            self.active = len(live)
            if not live:
                if self._queue.closed:
                    break
                continue
            try:
                _, responses = generator.next()
            except Exception as e:
                log.exception("batch step failed")
                for seq in live.values():
                    self._answer(seq.job, generation_failed(e))
                live.clear()
                generator.close()
                generator = self._new_generator(models)
                continue
            for response in responses:
                self._on_token(generator, live, response)
            self.active = len(live)
        generator.close()

    def _new_generator(self, models: Models) -> Any:
        from mlx_lm.generate import BatchGenerator

        return BatchGenerator(
            models.model,
            stop_tokens=[[t] for t in models.tokenizer.eos_token_ids],
            completion_batch_size=self.capacity,
            prefill_batch_size=min(self.capacity, 8),
        )

    def _admit(self, models: Models, generator: Any, live: dict[int, _Sequence]) -> None:
        import mlx.core as mx

        while len(live) < self.capacity:
            job = self._queue.get(block=not live)  # idle: sleep until work or shutdown
            if job is None:
                return
            if job.cancelled.is_set():
                self._answer(job, aborted())
                continue
            request = job.request
            if request.seed is not None:
                mx.random.seed(request.seed)
            try:
                (uid,) = generator.insert(
                    [list(job.prompt_ids)],
                    max_tokens=[request.max_tokens],
                    samplers=[sampler_for(request)],
                    logits_processors=[processors_for(request)],
                )
            except ValueError as e:
                self._answer(job, Failed(RouterError(400, str(e))))
                continue
            live[uid] = _Sequence(job, Progress(job, 0), models.tokenizer.detokenizer)
            self.active = len(live)

    def _drop_cancelled(self, generator: Any, live: dict[int, _Sequence]) -> None:
        gone = [uid for uid, seq in live.items() if seq.job.cancelled.is_set()]
        if gone:
            generator.remove(gone)
            for uid in gone:
                self._answer(live.pop(uid).job, aborted())

    def _on_token(self, generator: Any, live: dict[int, _Sequence], response: Any) -> None:
        seq = live.get(response.uid)
        if seq is None:
            return
        reason = response.finish_reason
        if reason != "stop":  # "stop" here is the EOS token itself: not part of the text
            seq.detokenizer.add_token(response.token)
        if reason is not None:
            seq.detokenizer.finalize()
        if seq.progress.token(seq.detokenizer.last_segment, False):
            if reason is None:
                generator.remove([response.uid])
            reason = "stop"
        if reason is not None:
            del live[response.uid]
            self._answer(seq.job, seq.progress.finish(reason))
