"""The generation thread: every model load and forward pass happens on it, nowhere else.

Two engines share the plumbing (a job queue in, events out, a cancel flag read every step):

- ``SpeculativeEngine`` (``router.worker.engines.speculative``) runs one request at a time
  through its own draft-and-verify loop, with a draft model, prompt lookup or the request's
  prediction.
- ``BatchingEngine`` (``router.worker.engines.batching``) feeds ``mlx_lm.generate.BatchGenerator``:
  requests join the running batch between decoding steps, up to ``capacity`` sequences.

Seeds: ``mx.random.seed`` is global. On the speculative lane a seeded request is reproducible;
on the batching lane the seed is applied when the request joins the batch, so it is only
reproducible while the request decodes alone.
"""

from __future__ import annotations

import logging
import threading
import uuid
from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from router.kernel.errors import LoadError, RouterError, internal_error
from router.worker.decoding.sampling import GREEDY
from router.worker.decoding.stops import StopScanner
from router.worker.drafting.draftcontrol import PassCost
from router.worker.engines.cores import CoreShare
from router.worker.engines.jobs import Event, Failed, Finished, Job, JobQueue, TextDelta, aborted
from router.worker.engines.logprobs import Aligner, Picked
from router.worker.engines.stats import SpecCounter, usage
from router.worker.request.protocol import GenerationRequest

log = logging.getLogger("speclane.worker")


@dataclass(frozen=True)
class Models:
    model: Any
    tokenizer: Any
    draft: Any | None = None


def sampler_for(request: GenerationRequest) -> Callable[..., Any]:
    from mlx_lm.sample_utils import make_sampler

    if request.temperature == 0:  # as make_sampler: the other knobs do nothing at 0
        return GREEDY
    return make_sampler(
        temp=request.temperature, top_p=request.top_p, min_p=request.min_p, top_k=request.top_k
    )


def processors_for(
    request: GenerationRequest, on_error: Callable[[str], None] | None = None
) -> list[Callable[..., Any]]:
    """The request's logits processors, fresh per job (a grammar matcher holds its state).

    The decoding constraint comes last, so that penalties and biases never re-open a token
    the grammar has closed. ``on_error``: told if the constraint fails mid-answer
    (``Job.constraint_failed``).
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
        processors.append(request.constraint.processor(on_error))
    return processors


def constraint_failed(job: Job) -> Failed:
    constraint = job.request.constraint
    param = getattr(constraint, "param", None)
    return Failed(
        RouterError(
            400,
            f"the answer could not follow '{param}': the constraint library failed "
            f"mid-answer ({job.constraint_error}); simplify the schema",
            param=param,
            code="constraint_failed",
        )
    )


def generation_failed(error: Exception) -> Failed:
    """An unexpected failure of a step (a defect: the request was checked at the boundary),
    logged with its traceback under a reference the answer names; the answer holds no text
    of the exception (it may quote another request's data)."""
    reference = uuid.uuid4().hex[:12]
    log.error("generation failed (reference %s)", reference, exc_info=error)
    return Failed(internal_error("the lane worker", reference, type="server_error"))


def aligner_for(job: Job, tokenizer: Any) -> Aligner | None:
    """The job's log-probabilities' aligner when it asked for them."""
    if job.request.logprobs is None:
        return None
    return Aligner(lambda token: str(tokenizer.decode([token])))


class Emitter:
    """One job's text on its way out: stop strings, and the log-probabilities that go with
    the text sent (a request that asked)."""

    def __init__(self, job: Job, aligner: Aligner | None = None) -> None:
        self.job = job
        self.scanner = StopScanner(job.request.stop)
        self.aligner = aligner

    def text(self, text: str, picked: Picked | None = None) -> bool:
        """One token's text (``picked``: its log-probability; None: text of no token of its
        own, the detokenizer's flush); True when a stop string completed."""
        if self.aligner is not None:
            if picked is None:
                self.aligner.more(text)
            else:
                self.aligner.token(text, picked)
        self._emit(self.scanner.feed(text))
        return self.scanner.stopped

    def flush(self) -> None:
        """The end of the answer: held text that was no stop string, and the last entries."""
        self._emit(self.scanner.flush())
        if self.aligner is not None and (rest := self.aligner.end(self.scanner.stopped)):
            self.job.emit(TextDelta("", rest))

    def _emit(self, out: str) -> None:
        entries = self.aligner.sent(len(out)) if self.aligner is not None else ()
        if out or entries:
            self.job.emit(TextDelta(out, entries))


class Progress:
    """One job's output on the generation thread: stop strings, counting, events."""

    def __init__(self, job: Job, num_draft_tokens: int, aligner: Aligner | None = None) -> None:
        self.job = job
        self.emitter = Emitter(job, aligner)
        self.scanner = self.emitter.scanner
        self.counter = SpecCounter(num_draft_tokens, job.request.budget)
        self.cached_tokens = 0  # prompt tokens taken from the prompt cache

    def token(self, text: str, from_draft: bool, picked: Picked | None = None) -> bool:
        """Count one generated token and emit its text (``picked``: its log-probability, or
        None for the end-of-sequence token, whose text is the detokenizer's flush); True when a
        stop string completed."""
        self.counter.observe(from_draft)
        return self.emitter.text(text, picked)

    def finish(self, reason: str) -> Event:
        self.emitter.flush()
        prompt = len(self.job.prompt_ids)
        spec = self.counter.snapshot()
        return Finished(
            reason,
            usage(prompt, self.counter.tokens, spec, self.cached_tokens),
            self.scanner.matched,
        )


class Engine(ABC):
    capacity: int

    def __init__(self, load: Callable[[], Models], queue: JobQueue | None = None) -> None:
        self._load = load
        self.models: Models | None = None
        self._queue = queue if queue is not None else JobQueue()
        self._open: set[Job] = set()  # submitted and not yet answered
        self._lock = threading.Lock()
        self._loaded = threading.Event()
        self._load_error: BaseException | None = None
        self._thread = threading.Thread(target=self._main, name="generation", daemon=True)
        self.active = 0
        # The machine's cores shared with the other lane process (``router.worker.engines.cores``);
        # None: this process's BLAS threads stay as they started.
        self.cores: CoreShare | None = None
        self.pass_cost = PassCost()  # each lane's own, with its setting

    def working(self, busy: bool) -> None:
        """Before a step (busy) or before waiting for work (idle): the core share's mark,
        and the thread count the step's passes are priced and timed at."""
        if self.cores is not None:
            self.cores.working(busy)
            if busy:
                self.pass_cost.threads = self.cores.threads

    def core_report(self) -> dict[str, object]:
        return self.cores.report() if self.cores is not None else {}

    @property
    def queued(self) -> int:
        return len(self._queue)

    @property
    def queue(self) -> JobQueue:
        return self._queue

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
        self.close()
        self._thread.join(timeout)

    def close(self) -> None:
        """Refuse new jobs, abort the queued ones, and flag the running ones to stop."""
        for job in self._queue.close():
            self._answer(job, aborted())
        with self._lock:
            running = list(self._open)
        for job in running:
            job.cancelled.set()

    def _answer(self, job: Job, event: Event) -> None:
        with self._lock:
            self._open.discard(job)
        if isinstance(event, Finished) and job.constraint_error is not None:
            event = constraint_failed(job)  # its text does not follow the schema
        job.prefill_done()  # its siblings wait no longer (the speculative lane's: till here)
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
