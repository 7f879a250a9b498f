"""The batching lane's engine: continuous batching over ``mlx_lm.generate.BatchGenerator``.

Requests join the running batch between decoding steps, up to ``capacity`` sequences; the
rest wait in the queue.

Prompt cache: a new prompt starts from the KV state of an earlier sequence sharing its
longest token prefix (``router.worker.engines.promptcache``), handed to ``BatchGenerator.insert``
with the tokens it holds, so only the rest is prefilled. Every sequence that ends (finished,
stopped by a stop string, or cancelled mid-prefill, so that a client's retry resumes where
the first try stopped) gives its KV state back to the cache.

Long prompts starve no one: ``BatchGenerator.next()`` runs one decoding step for the running
sequences and then prefills at most ``generator.prefill_step_size`` tokens of each prompt
being prefilled, so a long prompt is prefilled in chunks, each between two decoding steps,
and running streams keep producing tokens; a cancel is seen after at most one chunk. The
chunk is sized by time, not tokens: the engine measures the prefill rate and sets the step
before each call so that a chunk takes about ``chunk_seconds`` while other sequences decode
(``IDLE_FACTOR`` times that while none does), at most ``prefill_step_size`` tokens. A fixed
step would be either too big on a slow, busy machine (seconds between two tokens of every
running stream) or too small on a fast one (a long prompt's prefill cut into needlessly many
pieces).

``progress_tokens`` (prompt tokens prefilled plus tokens generated) only ever grows while
the lane works: the router reads it from /health to tell a lane that is busy
prefilling a long prompt from one that hangs.

Drafting: a sequence may draft from its ``prediction``, prompt lookup or ``suffix``
(``router.worker.drafting.draftlength`` picks the source and the length per batch size); each
decoding step verifies every sequence's draft in the batch's one forward pass
(``router.worker.engines.batchverify``). Every finished request's prompt and answer go into the
lane's own ``suffix`` index, in its client partition. A constrained sequence (tool calls,
``json_schema``) drafts its grammar's forced tokens chained with its source's proposals
(``router.worker.drafting.forced``, as on the speculative lane), every position verified under the
grammar's mask; ``usage.speclane_spec.forced`` counts the forced tokens kept.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from router.kernel.errors import RouterError
from router.kernel.worker_contract import DEFAULT_CHUNK_SECONDS, DEFAULT_PREFILL_STEP_SIZE
from router.worker.drafting.draftchoice import PLAIN as PLAIN_CHOICE
from router.worker.drafting.draftchoice import (
    Choice,
    Chooser,
    DraftCandidate,
    Evidence,
    Grade,
    batch_width,
    gap_filler,
)
from router.worker.drafting.draftcontrol import PassCost
from router.worker.drafting.draftlength import (
    AUTO_SOURCES,
    BATCH_DRAFT_TABLE,
    PLAIN,
    BatchDraftSettings,
    BatchPlan,
    batch_plan,
    forced_draft_length,
    sequence_draft_length,
)
from router.worker.drafting.drafts import PredictionDraft, PromptLookup
from router.worker.drafting.forced import ConstraintDraft, Draft
from router.worker.drafting.suffix import SuffixDraft, SuffixIndex
from router.worker.engines.batchverify import (
    RowDraft,
    drafting_generator,
    last_pass,
    last_verified,
    set_drafter,
    time_next_plain,
    tokens_of,
)
from router.worker.engines.engine import (
    Engine,
    Models,
    Progress,
    aligner_for,
    generation_failed,
    processors_for,
    sampler_for,
)
from router.worker.engines.jobs import Event, Failed, Finished, Job, JobQueue, aborted
from router.worker.engines.logprobs import pick
from router.worker.engines.promptcache import Counters, Lookup, PromptCache
from router.worker.engines.stats import SpecStats, usage

log = logging.getLogger("speclane.worker")

MIN_CHUNK = 16  # tokens: below this a chunk costs more in overhead than it spares
FIRST_CHUNK = 64  # before the first measurement
IDLE_FACTOR = 4  # a chunk's time budget while no sequence decodes, in chunk_seconds
RATE_WEIGHT = 0.5  # of the newest measurement in the prefill rate's moving average


@dataclass
class _Sequence:
    job: Job
    progress: Progress
    detokenizer: Any
    prefilled: int = 0  # prompt tokens of this sequence prefilled so far (from the generator)
    decoding: bool = False  # its prompt is done
    plan: BatchPlan = PLAIN
    propose: Callable[[list[int], int], list[int]] | None = None  # (history, k) -> draft
    prediction: PredictionDraft | None = None
    constraint: ConstraintDraft | None = None  # a constrained sequence drafting forced tokens
    chooser: Chooser | None = None  # which source drafts at each step (unconstrained)
    choice: Choice = PLAIN_CHOICE  # its draft of the step being verified
    draft: Draft | None = None  # its last draft under the grammar
    drafted: int = 0
    accepted: int = 0
    forced: int = 0  # accepted draft tokens its grammar forced
    steps: int = 0  # decoding steps in which it verified a draft
    output: list[int] = field(default_factory=list)  # the tokens generated so far


class BatchingEngine(Engine):
    def __init__(
        self,
        load: Callable[[], Models],
        capacity: int,
        *,
        prompt_cache_bytes: int = 0,
        prefill_step_size: int = DEFAULT_PREFILL_STEP_SIZE,
        chunk_seconds: float = DEFAULT_CHUNK_SECONDS,
        prompt_cache: PromptCache | None = None,
        queue: JobQueue | None = None,
        drafts: BatchDraftSettings | None = None,
    ) -> None:
        super().__init__(load, queue)
        if prefill_step_size < 1 or chunk_seconds <= 0:
            raise ValueError("prefill_step_size must be >= 1 and chunk_seconds > 0")
        self.capacity = capacity
        self.prefill_step_size = prefill_step_size
        self.chunk_seconds = chunk_seconds
        self.prefill_rate: float | None = None  # prompt tokens per second, moving average
        # ``prompt_cache``: one shared with the other lane (shared mode), else the lane's own.
        self.prompt_cache = (
            prompt_cache if prompt_cache is not None else PromptCache(prompt_cache_bytes)
        )
        self.cache_counters = Counters()
        self.prefill_tokens = 0  # prompt tokens computed, all requests (monotonic)
        self.generated_tokens = 0  # tokens generated, all requests (monotonic)
        self._generator: Any = None
        self._live: dict[int, _Sequence] = {}
        self.drafts = drafts if drafts is not None else BatchDraftSettings()
        # Earlier requests' prompts and answers, per client partition (generation thread only;
        # the lane's own, also in shared mode, where the two lanes may run on two threads).
        self.suffix = SuffixIndex(self.drafts.suffix)
        self.pass_cost = PassCost(self.drafts.draft_position_cost)
        self.evidence = Evidence()  # each source's acceptance per partition, request to request

    @property
    def progress_tokens(self) -> int:
        return self.prefill_tokens + self.generated_tokens

    def report(self) -> dict[str, object]:
        """Figures for /health (read from the event loop: plain ints, no locking needed)."""
        return {
            "progress_tokens": self.progress_tokens,
            "prefill_tokens": self.prefill_tokens,
            "generated_tokens": self.generated_tokens,
            "prefill_step_size": self.prefill_step_size,
            "prefill_rate": round(self.prefill_rate or 0.0, 1),
            "prompt_cache": self.prompt_cache.stats(self.cache_counters),
            "draft_table": [list(row) for row in BATCH_DRAFT_TABLE],
            "suffix_index": self.suffix.report(),
            **self.pass_cost.report(),
            **self.evidence.report(),
            **self.core_report(),
        }

    def _serve(self, models: Models) -> None:
        self.open_batch(models)
        while True:
            if not self._live and not len(self._queue):
                self.working(False)  # the other lane may take the cores while this one waits
            self.admit(models, block=not self._live)  # idle: sleep until work or shutdown
            if not self._live and self._queue.closed:
                break
            self.working(True)
            self.step(models)
        self.close_batch()

    # --- one step at a time (this lane's thread, or the shared worker's) -------------------

    def open_batch(self, models: Models) -> None:
        self._generator = self._new_generator(models)

    def close_batch(self) -> None:
        self._generator.close()

    @property
    def busy(self) -> bool:
        """Sequences in the batch, or jobs waiting for a place in it."""
        return bool(self._live) or len(self._queue) > 0

    def step(self, models: Models, others_waiting: bool = False) -> None:
        """One decoding step of the running sequences plus at most one prefill chunk of
        each prompt being prefilled (``BatchGenerator.next``); nothing when none runs.
        ``others_waiting``: another lane waits for this step to end (the shared worker), so
        a chunk keeps to ``chunk_seconds`` even while no sequence of the batch decodes."""
        generator, live = self._generator, self._live
        self._drop_cancelled(generator, live)
        self.active = len(live)
        if not live:
            return
        generator.prefill_step_size = self._chunk(live, others_waiting)
        # No proposer in the batch: mlx-lm's own step, with its pipelining intact.
        proposing = any(seq.plan.drafts for seq in live.values())
        set_drafter(generator, self._propose if proposing else None)
        time_next_plain(generator, proposing and self.pass_cost.needs_plain(len(live)))
        try:
            with generator.stats() as step:
                prompt_responses, responses = generator.next()
        except Exception as e:
            log.exception("batch step failed")
            for seq in live.values():
                self._answer(seq.job, generation_failed(e))
            live.clear()
            generator.close()
            self._generator = self._new_generator(models)
            self.active = 0
            return
        if (timed := last_pass(generator)) is not None:
            self.pass_cost.observe(*timed)
        for verified in last_verified(generator):
            if (drafting := live.get(verified.uid)) is not None:
                if drafting.chooser is not None:
                    drafting.chooser.verified(drafting.choice, verified.accepted)
                drafting.steps += 1
                drafting.drafted += verified.drafted
                drafting.accepted += verified.accepted
                drafting.forced += verified.forced
                if drafting.constraint is not None and drafting.draft is not None:
                    drafting.constraint.verified(drafting.draft, verified.accepted)
        for prompt_response in prompt_responses:
            self._on_prefill(live, prompt_response)
        self._measure(step.prompt_tokens, step.prompt_time)
        self.generated_tokens += len(responses)
        for response in responses:
            self._on_token(generator, live, response)
        self.active = len(live)

    def _chunk(self, live: dict[int, _Sequence], others_waiting: bool = False) -> int:
        """Prompt tokens per sequence for the next call: about ``chunk_seconds`` of work
        while some sequence decodes (or ``others_waiting``); ``IDLE_FACTOR`` times that while
        none does (bigger chunks prefill faster, and only a request that has just arrived
        waits for one)."""
        prefilling = sum(not seq.decoding for seq in live.values())
        if self.prefill_rate is None:
            return min(FIRST_CHUNK, self.prefill_step_size)
        idle = prefilling == len(live) and not others_waiting
        budget = self.chunk_seconds * (IDLE_FACTOR if idle else 1)
        tokens = int(self.prefill_rate * budget / max(1, prefilling))
        return max(MIN_CHUNK, min(tokens, self.prefill_step_size))

    def _measure(self, tokens: int, seconds: float) -> None:
        """Update the prefill rate from one call's prompt processing (the generator times it
        apart from the decoding step: counting that step in would shrink the chunks, which
        would make the step weigh more in the next measurement, and so on)."""
        if tokens < MIN_CHUNK or seconds <= 0:
            return  # too little prefill in this call to say anything
        rate = tokens / seconds
        old = self.prefill_rate
        self.prefill_rate = rate if old is None else old + RATE_WEIGHT * (rate - old)

    def _new_generator(self, models: Models) -> Any:
        return drafting_generator(
            models.model,
            self._propose,
            stop_tokens=[[t] for t in models.tokenizer.eos_token_ids],
            completion_batch_size=self.capacity,
            prefill_batch_size=min(self.capacity, 8),
            prefill_step_size=self.prefill_step_size,
        )

    def admit(self, models: Models, block: bool = False) -> None:
        """Let queued jobs join the batch up to ``capacity``; ``block``: wait for the first."""
        import mlx.core as mx

        generator, live = self._generator, self._live
        while len(live) < self.capacity:
            job = self._queue.get(block=block and not live)
            if job is None:
                return
            if job.cancelled.is_set():
                self._answer(job, aborted())
                continue
            request = job.request
            if request.seed is not None:
                mx.random.seed(request.seed)
            prompt = list(job.prompt_ids)
            lookup = self._lookup(job, prompt)
            try:
                (uid,) = generator.insert(
                    [lookup.rest],
                    max_tokens=[request.budget],
                    caches=[lookup.cache],
                    all_tokens=[prompt[: lookup.cached_tokens]],
                    samplers=[sampler_for(request)],
                    logits_processors=[processors_for(request, job.constraint_failed)],
                )
            except ValueError as e:
                self._answer(job, Failed(RouterError(400, str(e))))
                continue
            progress = Progress(job, 0, aligner_for(job, models.tokenizer))
            progress.cached_tokens = lookup.cached_tokens
            seq = _Sequence(job, progress, models.tokenizer.detokenizer)
            self._plan(seq)
            live[uid] = seq
            self.active = len(live)

    def _lookup(self, job: Job, prompt: list[int]) -> Lookup:
        """What ``job``'s prompt starts from (a group's rank 0 agrees on it with the others)."""
        return self.prompt_cache.fetch(prompt, job.partition, counters=self.cache_counters)

    def _keep(self, uid: int, tokens: list[int], cache: Any, job: Job) -> None:
        """A finished sequence's KV state into the prompt cache (with its prompt's segments)."""
        self.prompt_cache.store(tokens, cache, job.partition, segments=job.segments)

    def _plan(self, seq: _Sequence) -> None:
        """The sequence's draft source and proposer (none: plain decoding)."""
        job = seq.job
        request = job.request
        others = processors_for(dataclasses.replace(request, constraint=None))
        constrained = request.constraint is not None
        seq.plan = batch_plan(request, self.drafts, bool(others), constrained)
        if seq.plan.forced:
            seq.constraint = ConstraintDraft.for_constraint(
                request.constraint, len(job.prompt_ids), job.constraint_failed
            )
        candidates = [self._candidate(seq, name) for name in self._sources(seq)]
        candidates = [c for c in candidates if c.most > 0]
        if not candidates:
            return
        if seq.constraint is not None:  # fills the gaps between its grammar's forced runs
            filler = gap_filler(candidates)
            assert filler is not None  # candidates is not empty
            seq.propose = filler.propose
        else:
            seq.propose = candidates[0].propose
            seq.chooser = Chooser(candidates, self.pass_cost)

    @staticmethod
    def _sources(seq: _Sequence) -> tuple[str, ...]:
        source = seq.plan.source
        if source != "auto":
            return (source,) if source is not None else ()
        return ("prediction", *AUTO_SOURCES) if seq.job.request.prediction else AUTO_SOURCES

    def _candidate(self, seq: _Sequence, name: str) -> DraftCandidate:
        job = seq.job
        propose: Callable[[list[int], int], list[int]]
        grade: Grade | None = None
        if name == "prediction":
            prediction = seq.prediction = PredictionDraft(
                job.prediction_ids, self.drafts.prediction
            )
            prompt_len = len(job.prompt_ids)
            propose, most = (
                lambda history, k: prediction.propose(history[prompt_len:], k),
                self.drafts.prediction.max_draft,
            )
        elif name == "prompt_lookup":
            lookup = PromptLookup(self.drafts.lookup)
            propose, most, grade = lookup.propose, self.drafts.lookup.max_draft, lookup.grade
        else:
            suffix = SuffixDraft(self.suffix, job.partition)
            propose, most, grade = suffix.propose, self.drafts.suffix.max_draft, suffix.grade
        acceptance = self.evidence.acceptance(job.partition, name)
        return DraftCandidate(name, propose, min(most, seq.plan.k), acceptance, grade=grade)

    def _propose(
        self, uids: list[int], histories: list[list[int]], room: list[int]
    ) -> list[RowDraft]:
        """Each decoding sequence's draft for this step (``batchverify.Drafter``): its length
        at most the table's for ``len(uids)`` sequences; a constrained one's forced runs
        chained with its source's proposal, with the grammar's masks. The pass's width is
        the batch's choice (``draftchoice.batch_width``): every free row then drafts its
        proposal up to it."""
        size = len(uids)
        drafts: list[RowDraft] = []
        sizable: list[tuple[int, _Sequence, list[float]]] = []
        settled, floor = 0.0, 0  # what the rows the width does not size emit, and need
        for uid, history, left in zip(uids, histories, room, strict=True):
            seq = self._live.get(uid)
            if seq is None or not seq.plan.drafts or seq.job.cancelled.is_set():
                drafts.append([])
                settled += 1.0
                continue
            k = sequence_draft_length(size, seq.plan.k, left) if seq.propose else 0
            if seq.constraint is None:
                drafts.append(self._free_draft(seq, history, k, size))
                curve = seq.chooser.curve(seq.choice, k) if k and seq.chooser else None
                if curve is not None:
                    sizable.append((len(drafts) - 1, seq, curve))
                    continue
            else:
                budget = max(k, forced_draft_length(size, seq.plan.forced, left))
                seq.draft = None
                if budget:
                    seq.draft = seq.constraint.draft(history, budget, seq.propose, k)
                drafts.append(seq.draft or [])
            drafted = len(tokens_of(drafts[-1]))
            settled += 1.0 + drafted  # a forced run is nearly always kept
            floor = max(floor, drafted)
        if not sizable:
            return drafts
        profile = self.pass_cost.profile(size)
        width = batch_width([curve for _, _, curve in sizable], profile, settled, floor)
        for i, seq, curve in sizable:
            n = min(width, len(curve) - 1)
            if seq.chooser is not None and n != len(tokens_of(drafts[i])):
                seq.choice = seq.chooser.resize(seq.choice, n)
                drafts[i] = seq.choice.tokens
        return drafts

    @staticmethod
    def _free_draft(seq: _Sequence, history: list[int], most: int, rows: int) -> list[int]:
        """An unconstrained sequence's draft: at most ``most`` tokens from the source that
        pays best now (``router.worker.drafting.draftchoice``), else none."""
        chooser = seq.chooser
        seq.choice = PLAIN_CHOICE
        if not most or chooser is None:
            return []
        chooser.rows = rows
        seq.choice = chooser.choose(history, most)
        return seq.choice.tokens

    def _drop_cancelled(self, generator: Any, live: dict[int, _Sequence]) -> None:
        gone = [uid for uid, seq in live.items() if seq.job.cancelled.is_set()]
        if gone:
            self._remove(generator, live, gone)
            for uid in gone:
                self._answer(live.pop(uid).job, aborted())

    def _remove(self, generator: Any, live: dict[int, _Sequence], uids: list[int]) -> None:
        """Take sequences out of the batch, keeping their KV state in the prompt cache (each
        in its request's partition)."""
        caches = generator.remove(uids, return_prompt_caches=self.prompt_cache.enabled)
        for uid, (cache, tokens) in caches.items():
            job = live[uid].job
            self.prompt_cache.store(tokens, cache, job.partition, segments=job.segments)

    def _on_prefill(self, live: dict[int, _Sequence], response: Any) -> None:
        seq = live.get(response.uid)
        done = response.progress[0] if isinstance(response.progress, tuple) else 0
        if seq is not None and done > seq.prefilled:
            self.prefill_tokens += done - seq.prefilled
            seq.prefilled = done

    def _on_token(self, generator: Any, live: dict[int, _Sequence], response: Any) -> None:
        seq = live.get(response.uid)
        if seq is None:
            return
        if not seq.decoding and seq.job.shares_prefill and response.finish_reason is None:
            self._share_prefill(generator, response.uid, seq.job)
        seq.decoding = True
        seq.output.append(response.token)
        reason = response.finish_reason
        if reason != "stop":  # "stop" here is the EOS token itself: not part of the text
            seq.detokenizer.add_token(response.token)
        if reason is not None:
            seq.detokenizer.finalize()
            self._keep(response.uid, response.all_tokens, response.prompt_cache, seq.job)
        picked = None
        if seq.progress.emitter.aligner is not None and reason != "stop":
            # The distribution the row's token was sampled from (a verified position's on a
            # verify pass), read only for a request that asked.
            picked = pick(response.logprobs[None], [response.token], seq.job.request.logprobs or 0)[
                0
            ]
        if seq.progress.token(seq.detokenizer.last_segment, False, picked):
            if reason is None:
                self._remove(generator, live, [response.uid])
            reason = "stop"
        if reason is not None:
            del live[response.uid]
            self._answer(seq.job, self._finish(seq, reason))

    def _share_prefill(self, generator: Any, uid: int, job: Job) -> None:
        """``n > 1``: the first choice's prompt (and first token) into the prompt cache now
        that it is prefilled, so that the other choices' rows start from it."""
        if self.prompt_cache.enabled:
            for cache, tokens in generator.extract_cache([uid]).values():
                self.prompt_cache.store(list(tokens), cache, job.partition)
        job.prefill_done()

    def _finish(self, seq: _Sequence, reason: str) -> Event:
        """The answer, with the draft statistics of a sequence that drafted (as the
        speculative lane reports them); its prompt and answer go into the ``suffix`` index
        (whatever it drafted with: a plain first answer drafts its retry)."""
        self.suffix.insert(seq.job.partition, [*seq.job.prompt_ids, *seq.output])
        if seq.chooser is not None:
            self.evidence.record(seq.job.partition, seq.chooser.acceptances())
        event = seq.progress.finish(reason)
        if not seq.plan.drafts or not isinstance(event, Finished):
            return event
        tokens = seq.progress.counter.tokens
        stats = SpecStats(seq.drafted, seq.accepted, seq.steps, max(seq.plan.k, seq.plan.forced))
        body = usage(len(seq.job.prompt_ids), tokens, stats, seq.progress.cached_tokens)
        spec = body["speclane_spec"]
        assert isinstance(spec, dict)
        spec["source"] = seq.plan.source or "forced"  # as the speculative lane names it
        spec["forced"] = seq.forced  # accepted draft tokens the grammar forced
        if seq.chooser is not None:  # what each source drafted, and the steps none paid
            spec["sources"] = seq.chooser.sources_report()
            spec["plain_steps"] = seq.chooser.plain_steps
        if seq.prediction is not None:  # OpenAI's meaning: prediction tokens (not) in the output
            body["completion_tokens_details"] = {
                "accepted_prediction_tokens": seq.prediction.matched,
                "rejected_prediction_tokens": seq.prediction.unmatched,
            }
        return Finished(event.finish_reason, body, event.stop_string)
