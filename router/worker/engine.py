"""The generation thread: every model load and forward pass happens on it, nowhere else.

Two engines share the plumbing (a job queue in, events out, a cancel flag read every step):

- ``SpeculativeEngine`` runs one request at a time through ``mlx_lm.stream_generate`` with the
  draft model (or without it when the request asks for ``num_draft_tokens: 0``), counting the
  draft statistics from the per-token ``from_draft`` flags (``router.worker.stats``).
- ``BatchingEngine`` (``router.worker.batching``) feeds ``mlx_lm.generate.BatchGenerator``:
  requests join the running batch between decoding steps, up to ``capacity`` sequences.

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
    """The request's logits processors, fresh per job (a grammar matcher holds its state).

    The decoding constraint comes last, so that penalties and biases never re-open a token
    the grammar has closed.
    """
    from mlx_lm.sample_utils import make_logits_processors

    repetition = request.repetition_penalty
    processors = make_logits_processors(
        logit_bias=dict(request.logit_bias) or None,
        repetition_penalty=None if repetition == 1.0 else repetition,
        presence_penalty=request.presence_penalty or None,
        frequency_penalty=request.frequency_penalty or None,
    )
    if request.constraint is not None:
        processors.append(request.constraint.processor())
    return processors


def generation_failed(error: Exception) -> Failed:
    return Failed(RouterError(500, f"generation failed: {error}", type="server_error"))


class Progress:
    """One job's output on the generation thread: stop strings, counting, events."""

    def __init__(self, job: Job, num_draft_tokens: int) -> None:
        self.job = job
        self.scanner = StopScanner(job.request.stop)
        self.counter = SpecCounter(num_draft_tokens, job.request.max_tokens)
        self.cached_tokens = 0  # prompt tokens taken from the prompt cache

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
        spec = self.counter.snapshot()
        return Finished(reason, usage(prompt, self.counter.tokens, spec, self.cached_tokens),
                        self.scanner.matched)


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

    def report(self) -> dict[str, object]:
        """Engine-specific figures added to /health (read from the event loop)."""
        return {}

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


class SpeculativeEngine(Engine):
    capacity = 1

    def __init__(self, load: Callable[[], Models], num_draft_tokens: int) -> None:
        super().__init__(load)
        self.num_draft_tokens = num_draft_tokens

    def effective_draft_tokens(self, request: GenerationRequest) -> int:
        """The worker's K, or fewer when the request asks (0: plain decoding)."""
        if self.models is None or self.models.draft is None:
            return 0
        asked = request.num_draft_tokens
        return self.num_draft_tokens if asked is None else min(asked, self.num_draft_tokens)

    def _serve(self, models: Models) -> None:
        while (job := self._queue.get(block=True)) is not None:
            self.active = 1
            try:
                self._answer(job, self._generate(models, job))
            except Exception as e:
                log.exception("generation failed")
                self._answer(job, generation_failed(e))
            finally:
                self.active = 0

    def _generate(self, models: Models, job: Job) -> Event:
        import mlx.core as mx
        from mlx_lm import stream_generate

        request = job.request
        if job.cancelled.is_set():
            return aborted()
        k = self.effective_draft_tokens(request)
        progress = Progress(job, k)
        if request.seed is not None:
            mx.random.seed(request.seed)
        kwargs: dict[str, Any] = {
            "max_tokens": request.max_tokens,
            "sampler": sampler_for(request),
            "logits_processors": processors_for(request),
        }
        if k:
            kwargs.update(draft_model=models.draft, num_draft_tokens=k)
        reason = "length"
        responses = stream_generate(models.model, models.tokenizer, job.prompt_ids, **kwargs)
        try:
            for response in responses:
                if progress.token(response.text, response.from_draft):
                    reason = "stop"
                    break
                reason = response.finish_reason or reason
                # Checked before pulling the next response: that pull runs the next round.
                if job.cancelled.is_set():
                    return aborted()
        finally:
            responses.close()
        return progress.finish(reason)
