"""A scripted engine: the real Engine plumbing (queue, cancel flags, answers, Progress with stop
strings and counting) around a fake "model" that writes a fixed reply one character per step.

Paced, it takes a step only when the test releases one, so tests can reason about exactly
which steps ran before and after a cancel.
"""

from __future__ import annotations

import threading
from typing import Any

from router.worker.engines.engine import Engine, Models, Progress, aligner_for, generation_failed
from router.worker.engines.jobs import Event, Job, aborted
from router.worker.engines.logprobs import Picked

STEP_TIMEOUT = 10.0


class CharTokenizer:
    def apply_chat_template(self, messages: list[dict[str, str]], **_: Any) -> str:
        return "".join(f"<{m['role']}>{m['content']}" for m in messages)

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        return [ord(c) for c in text]

    def decode(self, ids: list[int]) -> str:
        return "".join(chr(i) for i in ids)

    def __len__(self) -> int:
        return 0x110000


def scripted_logprob(index: int, char: str, k: int | None) -> Picked | None:
    """The scripted "model"'s log-probability of the ``index``-th character of its reply, and
    its alternatives: the character itself, then ``?``."""
    if k is None:
        return None
    logprob = -0.25 * (index + 1)
    return logprob, [(ord(char), logprob), (ord("?"), -9.0)][:k]


class ScriptedEngine(Engine):
    def __init__(self, reply: str, *, paced: bool = False, capacity: int = 1) -> None:
        super().__init__(lambda: Models(model=None, tokenizer=CharTokenizer()))
        self.capacity = capacity
        self.reply = reply
        self.fail_at: int | None = None  # step index at which the "model" raises
        # step index at which the decoding constraint fails (as GrammarProcessor reports it)
        self.constraint_fails_at: int | None = None
        self.steps_taken = 0
        self.started: list[Job] = []
        self.job_started = threading.Event()
        self.job_done = threading.Event()
        self.submitted = threading.Semaphore(0)  # one release per submitted request
        self.cancels = threading.Semaphore(0)  # one release per cancel() call
        self._steps = threading.Semaphore(0) if paced else None

    def release(self, steps: int = 1) -> None:
        assert self._steps is not None
        for _ in range(steps):
            self._steps.release()

    def submit(self, job: Job) -> None:
        super().submit(job)
        self.submitted.release()

    def cancel(self, job: Job) -> None:
        super().cancel(job)
        self.cancels.release()

    def _serve(self, models: Models) -> None:
        while (job := self._queue.get(block=True)) is not None:
            self.active = 1
            self.started.append(job)
            self.job_started.set()
            try:
                self._answer(job, self._run(job))
            finally:
                self.active = 0
                self.job_done.set()

    def _run(self, job: Job) -> Event:
        progress = Progress(job, 0, aligner_for(job, CharTokenizer()))
        max_tokens = job.request.budget
        for index, char in enumerate(self.reply[:max_tokens]):
            if self._steps is not None and not self._steps.acquire(timeout=STEP_TIMEOUT):
                return aborted()
            if job.cancelled.is_set():
                return aborted()
            self.steps_taken += 1
            if index == self.fail_at:
                return generation_failed(RuntimeError("scripted failure"))
            if index == self.constraint_fails_at:
                job.constraint_failed("scripted matcher failure")
            if progress.token(char, False, scripted_logprob(index, char, job.request.logprobs)):
                return progress.finish("stop")
        return progress.finish("stop" if len(self.reply) <= max_tokens else "length")


class ScriptedCache:
    """A trimmable KV cache that only counts positions (what ``trim_prompt_cache`` needs)."""

    def __init__(self) -> None:
        import mlx.core as mx

        self.tokens: list[int] = []  # what the positions hold, to check what is kept
        self.state = mx.array(0)

    @property
    def offset(self) -> int:
        return len(self.tokens)

    def is_trimmable(self) -> bool:
        return True

    def trim(self, n: int) -> int:
        n = min(self.offset, n)
        del self.tokens[len(self.tokens) - n :]
        return n


class ScriptedLM:
    """A "language model" that always continues ``text`` (token ids), then says ``eos``.

    Called like an mlx-lm model, ``model(inputs[None], cache=cache)``: it checks that what the
    cache kept from earlier passes is the script (so a rejected draft token left in the cache
    by a wrong trim fails loudly), appends the fed tokens, and answers one-hot logits of the
    scripted token after each position.
    """

    def __init__(
        self, text: list[int], eos: int, vocab: int = 0x180, peak: Any = lambda position: 10.0
    ) -> None:
        self.text = text
        self.eos = eos
        self.vocab = vocab
        self.peak = peak  # the scripted token's logit after each position (the rest: 0)
        self.passes: list[int] = []  # tokens fed per forward pass

    def __call__(self, inputs: Any, cache: list[ScriptedCache]) -> Any:
        import mlx.core as mx

        fed = inputs[0].tolist()
        start = cache[0].offset
        if cache[0].tokens != self.text[:start]:
            raise AssertionError(f"the cache kept {cache[0].tokens[-8:]}..., not the script")
        cache[0].tokens.extend(fed)
        self.passes.append(len(fed))
        rows = []
        for i in range(len(fed)):
            nxt = start + i + 1
            token = self.text[nxt] if nxt < len(self.text) else self.eos
            peak = self.peak(start + i)
            rows.append([peak if t == token else 0.0 for t in range(self.vocab)])
        return mx.array([rows])
