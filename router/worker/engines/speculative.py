"""The speculative lane: one request at a time, its own decode loop, pluggable draft sources.

Every step feeds the last emitted token plus up to k draft tokens through the target in one
forward pass (on a CPU that costs little more than decoding one token), samples the target at
every position, emits the longest run where the target's sample equals the draft plus the
target's own next token, and trims the rejected positions off the KV cache (mlx-lm's
``trim_prompt_cache``). Lossless by construction: every emitted token is the target's own
sample given exactly the emitted prefix, so greedy output is token for token that of plain
decoding, and with sampling each token is drawn from the target's distribution (a draft token
is only a guess the target's sample must reproduce).

Draft sources (``router.worker.drafting.drafts`` for the pure ones):
- ``draft_model``: a small model decodes k tokens greedily on its own KV cache, kept in step.
- ``prompt_lookup``: n-gram lookup in the prompt and the output so far.
- ``prediction``: the request's OpenAI ``prediction`` content, re-aligned on divergence.
- ``suffix``: n-gram lookup in earlier requests' prompts and answers of the same client
  partition (``router.worker.drafting.suffix``), and in the request's own context. Every finished
  request is indexed, whatever it drafted with, so a plain first answer drafts its retry.

A request chooses its source with the ``draft_source`` field (``draft_model``,
``prompt_lookup`` or ``suffix``; the router sets it per request family); a ``prediction``
still wins.

A constrained request (tool calls, ``json_schema``) drafts the tokens its grammar forces
chained with its source's proposals between them, one draft per step
(``router.worker.drafting.forced``), every position verified under the grammar's mask;
``usage.speclane_spec.forced`` counts the forced tokens kept. A request with other logits
processors (penalties, logit bias) decodes plainly: they depend on every previous token, and
drafting around them is not worth the risk.

Prompt cache: the KV cache of earlier requests (target and draft model, each under its own key)
is reused for the longest common token prefix (``router.worker.engines.promptcache``, bounded
in bytes; in shared mode the same cache as the batching lane's), only between requests of the same
partition (``router.worker.engines.promptcache.entry_key``).

A request runs as a ``SpecRun``, advanced one round (one draft-and-verify step, or one prefill
chunk of a long prompt) at a time: by the lane's own thread, or in shared mode by the one
generation thread that takes turns with the batching lane (``router.worker.engines.shared``).
"""

from __future__ import annotations

import dataclasses
import logging
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any, cast

from router.kernel.worker_contract import DRAFT_SOURCES
from router.worker.decoding.sampling import sampler_scores
from router.worker.drafting.draftchoice import (
    CERTAIN,
    DRAFT_MODEL,
    GAMMA_MAX_FEED,
    PLAIN,
    Chooser,
    DraftCandidate,
    DraftCost,
    Evidence,
    Grade,
    best_rate,
    gap_filler,
)
from router.worker.drafting.draftcontrol import PassCost
from router.worker.drafting.drafts import (
    LookupConfig,
    PredictionConfig,
    PredictionDraft,
    PromptLookup,
)
from router.worker.drafting.forced import FORCED_MAX_DRAFT, ConstraintDraft, Draft
from router.worker.drafting.suffix import SuffixConfig, SuffixDraft, SuffixIndex
from router.worker.engines.engine import (
    Emitter,
    Engine,
    Models,
    aligner_for,
    generation_failed,
    processors_for,
    sampler_for,
)
from router.worker.engines.jobs import Event, Finished, Job, JobQueue, aborted
from router.worker.engines.logprobs import Picked, pick
from router.worker.engines.promptcache import DRAFT, TARGET, Counters, PromptCache, Segment
from router.worker.engines.stats import SpecStats, usage
from router.worker.request.protocol import GenerationRequest

log = logging.getLogger("speclane.worker")

SOURCES = DRAFT_SOURCES
PREFILL_STEP = 512
# A prompt rest up to this many tokens is fed in the first token's pass, not prefilled apart.
MERGED_PROMPT_MAX = 64

Propose = Callable[[list[int], int, int], list[int]]  # (history, prompt_len, k) -> draft
FreePropose = Callable[[list[int], int], list[int]]  # (history, k) -> draft


@dataclass(frozen=True)
class SpeculativeConfig:
    # The lane's source for requests that name none: ``auto`` chooses at every step.
    draft_source: str = "draft_model"
    num_draft_tokens: int = 3  # draft_model's k
    lookup: LookupConfig = field(default_factory=LookupConfig)
    prediction: PredictionConfig = field(default_factory=PredictionConfig)
    prompt_cache_bytes: int = 512 << 20  # 0: no prompt cache
    suffix: SuffixConfig = field(default_factory=SuffixConfig)
    # A free source's draft length per step: None measures what a position costs.
    draft_position_cost: float | None = None

    def __post_init__(self) -> None:
        if self.draft_source not in SOURCES:
            raise ValueError(f"draft source must be one of {', '.join(SOURCES)}")


@dataclass(frozen=True)
class Plan:
    source: str | None  # None: no draft source (forced tokens only, or plain decoding)
    k: int
    forced: int = 0  # a constrained request: its grammar's forced tokens drafted per step


def plan(
    request: GenerationRequest,
    settings: SpeculativeConfig,
    has_draft: bool,
    has_processors: bool,
    constrained: bool = False,
) -> Plan:
    """Which draft source a request decodes with, and its maximum draft length (pure): its
    prediction, else its own ``draft_source``, else the lane's; plus the forced tokens of a
    ``constrained`` one. Plain with other processors or ``num_draft_tokens: 0``."""
    asked = request.num_draft_tokens
    if has_processors or asked == 0:
        return Plan(None, 0)

    def capped(k: int) -> int:
        return k if asked is None else min(asked, k)

    chosen = _source_plan(request, settings, has_draft, capped)
    if constrained:
        return dataclasses.replace(chosen, forced=capped(FORCED_MAX_DRAFT))
    return chosen


def _source_plan(
    request: GenerationRequest,
    settings: SpeculativeConfig,
    has_draft: bool,
    capped: Callable[[int], int],
) -> Plan:
    source = request.draft_source or settings.draft_source
    if source == "auto":
        most = max(settings.lookup.max_draft, settings.suffix.max_draft)
        if request.prediction:
            most = max(most, settings.prediction.max_draft)
        if has_draft and settings.num_draft_tokens:
            most = max(most, settings.num_draft_tokens)
        return Plan("auto", capped(most))
    if request.prediction:
        return Plan("prediction", capped(settings.prediction.max_draft))
    if source == "draft_model" and has_draft and settings.num_draft_tokens:
        return Plan("draft_model", capped(settings.num_draft_tokens))
    if source == "prompt_lookup":
        return Plan("prompt_lookup", capped(settings.lookup.max_draft))
    if source == "suffix":
        return Plan("suffix", capped(settings.suffix.max_draft))
    return Plan(None, 0)


# --- the MLX side ---------------------------------------------------------------------------


def prefill(model: Any, cache: list[Any], tokens: list[int]) -> None:
    """Run ``tokens`` through ``model`` into ``cache`` in bounded steps (no logits kept)."""
    for _ in prefill_chunks(model, cache, tokens):
        pass


def prefill_chunks(model: Any, cache: list[Any], tokens: list[int]) -> Iterator[int]:
    """``prefill``, one ``PREFILL_STEP`` chunk per iteration; yields the tokens done so far."""
    import mlx.core as mx

    for start in range(0, len(tokens), PREFILL_STEP):
        model(mx.array(tokens[start : start + PREFILL_STEP], mx.uint32)[None], cache=cache)
        mx.eval([c.state for c in cache])
        yield min(start + PREFILL_STEP, len(tokens))


def common_prefix(a: Sequence[int], b: Sequence[int]) -> int:
    n = 0
    for x, y in zip(a, b, strict=False):
        if x != y:
            break
        n += 1
    return n


class DraftModel:
    """A draft model proposing k greedy tokens; its cache follows the accepted history.
    ``timed``: called with (passes, seconds) after a proposal whose catch-up was short (a
    step's cost, not a prompt's prefill)."""

    def __init__(
        self,
        model: Any,
        cache: list[Any],
        cached: list[int],
        timed: Callable[[int, float], None] | None = None,
    ) -> None:
        self.model = model
        self.cache = cache
        self.cached = cached  # the tokens in ``cache``
        self.timed = timed

    def propose(self, history: list[int], prompt_len: int, k: int) -> list[int]:
        import mlx.core as mx
        from mlx_lm.models.cache import trim_prompt_cache

        started = time.perf_counter()
        keep = min(common_prefix(self.cached, history), len(history) - 1)
        trim_prompt_cache(self.cache, len(self.cached) - keep)
        feed = history[keep:]
        prefill(self.model, self.cache, feed[:-1])
        y = mx.array(feed[-1:], mx.uint32)
        drafts = []
        for _ in range(k):
            logits = self.model(y[None], cache=self.cache)[0, -1]
            y = mx.argmax(logits, axis=-1, keepdims=True).astype(mx.uint32)
            mx.async_eval(y)
            drafts.append(y)
        # A 1-D uint32 array: its tolist() is a list of ints (the stub types every rank).
        tokens = cast("list[int]", mx.concatenate(drafts).tolist()) if drafts else []
        # The last draft was produced but never fed.
        self.cached = history + tokens[:-1] if tokens else history[:-1]
        if self.timed is not None and tokens and len(feed) <= GAMMA_MAX_FEED:
            self.timed(len(tokens) + (1 if len(feed) > 1 else 0), time.perf_counter() - started)
        return tokens


def time_pass(model: Any, repeats: int = 3) -> float:
    """The fastest of ``repeats`` one-position passes of ``model`` after a short prompt:
    a calibration of what one decoding step costs."""
    import mlx.core as mx
    from mlx_lm.models.cache import make_prompt_cache

    cache = make_prompt_cache(model)
    prefill(model, cache, [1, 2, 3, 4])
    best = float("inf")
    for i in range(repeats + 1):  # the first pass warms up
        started = time.perf_counter()
        mx.eval(model(mx.array([[5 + i]], mx.uint32), cache=cache))
        if i:
            best = min(best, time.perf_counter() - started)
    return best


def lookup_proposer(config: LookupConfig) -> Propose:
    lookup = PromptLookup(config)
    return lambda history, prompt_len, k: lookup.propose(history, k)


def prediction_proposer(draft: PredictionDraft) -> Propose:
    return lambda history, prompt_len, k: draft.propose(history[prompt_len:], k)


def suffix_proposer(draft: SuffixDraft) -> Propose:
    return lambda history, prompt_len, k: draft.propose(history, k)


@dataclass
class Step:
    tokens: list[int]  # emitted this step, in order
    accepted: int  # how many of them were draft tokens
    drafted: int
    forced: int = 0  # how many of the accepted ones the grammar forced
    logprobs: list[Picked] | None = None  # per emitted token, when the request asked


def decode(
    model: Any,
    cache: list[Any],
    history: list[int],
    cached: int,
    *,
    max_tokens: int,
    sampler: Callable[[Any], Any],
    processors: Sequence[Callable[[Any, Any], Any]] = (),
    propose: Propose | None = None,
    k: int = 0,
    stop_tokens: frozenset[int] = frozenset(),
    constraint: ConstraintDraft | None = None,
    forced_k: int = 0,
    chooser: Chooser | None = None,
    top_logprobs: int | None = None,
) -> Iterator[Step]:
    """Generate after ``history`` (the prompt), of which ``cache`` holds the first ``cached``.

    ``history`` grows in place with every emitted token; once the first token is emitted,
    whenever the generator ends (or is closed) the cache holds exactly ``history[:-1]``, ready
    for the prompt cache. A prompt longer than one ``PREFILL_STEP`` chunk is prefilled one chunk
    per step, each yielded as a step with no tokens (a point to cancel, or to let the shared
    worker's batch take its turn). ``constraint``: every position is masked by the grammar
    (instead of ``processors``), and each step's draft chains the grammar's forced runs with
    ``propose``'s tokens after them (``ConstraintDraft.draft``), at most ``max(forced_k, k)``
    tokens in all. ``chooser``: which source drafts at each step, and whether any does
    (``router.worker.drafting.draftchoice``), its passes timed for it; without one, ``propose``
    drafts ``k`` at every step. ``top_logprobs``: each emitted token's log-probability (at
    the verified position it was sampled from) with that many alternatives; None: none.
    """
    import mlx.core as mx
    from mlx_lm.models.cache import trim_prompt_cache

    if not 0 <= cached < len(history):
        raise ValueError("the cache must leave at least one prompt token to feed")
    prompt_len = len(history)
    # A short rest of the prompt (a new turn after a cached conversation) goes through with
    # its last token in the first token's pass: one pass fewer. A longer one is prefilled
    # first, one chunk per step (each a point to cancel or yield): the first pass computes
    # logits at every position it feeds.
    pending = history[cached:-1]
    head = 0 if len(pending) <= MERGED_PROMPT_MAX else len(pending)
    for done in prefill_chunks(model, cache, pending[:head]):
        if done < head:
            yield Step([], 0, 0)
    first_pass = history[cached + head :]
    if chooser is None and propose is not None and k > 0 and constraint is None:
        chooser = single_chooser(propose, prompt_len, k)
    produced = 0
    while produced < max_tokens:
        budget = max_tokens - produced
        draft: list[int] = []
        choice = PLAIN
        grammar: Draft | None = None
        # The first token goes out on a plain step: a verify pass is wider (and a draft
        # model would first prefill the whole prompt), and the first token is what a client
        # waits on. Drafting starts with the second.
        if constraint is not None:
            # The forced runs and the source's proposals after them, one draft (the last
            # position of the budget is the target's own token).
            free = None if propose is None else _free(propose, prompt_len)
            longest = min(budget - 1, max(forced_k, k)) if produced else 0
            grammar = constraint.draft(history, longest, free, k)
            draft = grammar.tokens
        elif chooser is not None and budget > 1 and produced:
            choice = chooser.choose(history, budget - 1)
            draft = choice.tokens
        started = time.perf_counter()
        fed = first_pass if not produced else history[-1:]
        inputs = mx.array(fed + draft, mx.uint32)
        logits = model(inputs[None], cache=cache)[0]  # (len(fed) + len(draft), vocab)
        if len(fed) > 1:
            logits = logits[len(fed) - 1 :]  # the prompt's own positions predict nothing
        if grammar is not None:
            logits = mx.where(mx.array(grammar.mask(logits.shape[-1])), logits, -mx.inf)
        elif processors:  # only ever without a draft: one row
            context = mx.array(history, mx.uint32)
            for processor in processors:
                logits = processor(context, logits)
        sampled: list[int] = sampler(sampler_scores([sampler], logits)).tolist()
        n = 0
        while n < len(draft) and sampled[n] == draft[n]:
            n += 1
        if chooser is not None and grammar is None:
            if produced:  # the first pass is as wide as the prompt's tail: not a step's cost
                chooser.passed(1 + len(draft), time.perf_counter() - started)
            chooser.verified(choice, n)
        emitted = sampled[: n + 1]
        for i, token in enumerate(emitted):
            if token in stop_tokens:
                emitted = emitted[: i + 1]
                break
        history.extend(emitted)
        produced += len(emitted)
        # The cache took the fed positions and the draft's; keep those of history[:-1] only.
        trim_prompt_cache(cache, len(draft) + 1 - len(emitted))
        accepted = min(n, len(emitted))
        forced = 0
        if grammar is not None and constraint is not None:
            forced = grammar.forced_kept(accepted)
            constraint.verified(grammar, accepted)
        picked = None
        if top_logprobs is not None:  # the positions emitted from: only those, only if asked
            picked = pick(logits[: len(emitted)], emitted, top_logprobs)
        yield Step(emitted, accepted, len(draft), forced, picked)
        if emitted[-1] in stop_tokens:
            return


def _free(propose: Propose, prompt_len: int) -> Callable[[list[int], int], list[int]]:
    return lambda context, k: propose(context, prompt_len, k)


def single_chooser(propose: Propose, prompt_len: int, k: int) -> Chooser:
    """One source drafting ``k`` at every step."""
    return Chooser(
        [DraftCandidate("source", _free(propose, prompt_len), k)], PassCost(), paced=False
    )


# --- the engine -----------------------------------------------------------------------------


class SpecProgress:
    """One job's output: detokenizing, stop strings, counting, the usage object."""

    def __init__(self, job: Job, tokenizer: Any, source: str | None) -> None:
        self.job = job
        self.source = source
        self.detokenizer = tokenizer.detokenizer
        self.eos = frozenset(tokenizer.eos_token_ids)
        self.emitter = Emitter(job, aligner_for(job, tokenizer))
        self.scanner = self.emitter.scanner
        self.tokens = 0
        self.drafted = 0
        self.accepted = 0
        self.forced = 0
        self.steps = 0
        self.k = 0

    def step(self, step: Step) -> bool:
        """Emit one step's text; True when generation must end here (EOS or a stop string)."""
        if step.drafted:
            self.steps += 1
            self.drafted += step.drafted
            self.accepted += step.accepted
            self.forced += step.forced
        for i, token in enumerate(step.tokens):
            self.tokens += 1
            if token in self.eos:
                return True
            self.detokenizer.add_token(token)
            picked = step.logprobs[i] if step.logprobs else None
            if self.emitter.text(self.detokenizer.last_segment, picked):
                return True
        return False

    def finish(
        self,
        reason: str,
        cached_tokens: int,
        prediction: PredictionDraft | None,
        chooser: Chooser | None = None,
    ) -> Finished:
        self.detokenizer.finalize()
        if not self.scanner.stopped:
            self.emitter.text(self.detokenizer.last_segment)
        self.emitter.flush()
        if self.scanner.stopped:
            reason = "stop"
        stats = SpecStats(self.drafted, self.accepted, self.steps, self.k)
        body = usage(len(self.job.prompt_ids), self.tokens, stats)
        spec = body["speclane_spec"]
        assert isinstance(spec, dict)
        spec["source"] = self.source
        spec["forced"] = self.forced  # accepted draft tokens the grammar forced
        if chooser is not None and chooser.candidates:  # what each source drafted, steps none paid
            spec["sources"] = chooser.sources_report()
            spec["plain_steps"] = chooser.plain_steps
        if prediction is not None:  # OpenAI's meaning: prediction tokens (not) in the output
            body["completion_tokens_details"] = {
                "accepted_prediction_tokens": prediction.matched,
                "rejected_prediction_tokens": prediction.unmatched,
            }
        body["prompt_tokens_details"] = {"cached_tokens": cached_tokens}
        return Finished(reason, body)


class SpeculativeEngine(Engine):
    capacity = 1
    calibrates_at_start = True

    def __init__(
        self,
        load: Callable[[], Models],
        settings: SpeculativeConfig,
        *,
        prompt_cache: PromptCache | None = None,
        queue: JobQueue | None = None,
    ) -> None:
        super().__init__(load, queue)
        self.settings = settings
        # ``prompt_cache``: one shared with the other lane (shared mode), else the lane's own.
        self.prompt_cache = (
            prompt_cache if prompt_cache is not None else PromptCache(settings.prompt_cache_bytes)
        )
        self.cache_counters = Counters()
        self.run: SpecRun | None = None  # the request being decoded
        self.progress_tokens = 0  # grows with every prefill chunk and generated token
        # Earlier requests' prompts and answers, per client partition (generation thread only).
        self.suffix = SuffixIndex(settings.suffix)
        self.pass_cost = PassCost(settings.draft_position_cost)
        self.draft_cost = DraftCost()  # the draft model's pass time relative to the target's
        self.evidence = Evidence()  # each source's acceptance per partition, request to request
        self.calibrated = threading.Event()  # the draft model's cost is measured

    @property
    def num_draft_tokens(self) -> int:
        return self.settings.num_draft_tokens

    def report(self) -> dict[str, object]:
        """The prompt cache's and the suffix index's figures for /health (plain ints, read
        from the event loop)."""
        return {
            "progress_tokens": self.progress_tokens,
            "prompt_cache": self.prompt_cache.stats(self.cache_counters),
            "suffix_index": self.suffix.report(),
            **self.pass_cost.report(),
            **self.draft_cost.report(),
            **self.evidence.report(),
            **self.core_report(),
        }

    def calibrate(self, models: Models) -> None:
        """Time one decoding pass of the target and of the draft model, once: what a draft
        model's proposal costs is known before a request could pay for it (as the lane
        starts; over a group, when a request first could use it)."""
        if models.draft is None or self.draft_cost.gamma is not None:
            return
        target = time_pass(models.model)
        self.pass_cost.seed_plain(1, target)
        self.draft_cost.observe(1, time_pass(models.draft), target)
        self.calibrated.set()
        log.info("draft model pass: %.2fx the target's", self.draft_cost.gamma or 0.0)

    def calibrate_at_start(self, models: Models) -> None:
        """Calibrate before the first request (which would otherwise wait for it): a lane
        whose requests may draft from its draft model under ``auto``."""
        if self.calibrates_at_start and models.draft is not None and self.num_draft_tokens:
            self.calibrate(models)

    def draft_pays(self, k: int) -> bool:
        """The draft model can yield more than plain decoding here, were every token kept."""
        gamma = self.draft_cost.gamma
        return gamma is None or best_rate(CERTAIN, self.pass_cost.profile(1), k, gamma) > 1.0

    def plan(self, request: GenerationRequest) -> Plan:
        has_draft = self.models is not None and self.models.draft is not None
        others = processors_for(dataclasses.replace(request, constraint=None))
        return plan(
            request,
            self.settings,
            has_draft,
            bool(others),
            constrained=request.constraint is not None,
        )

    def _serve(self, models: Models) -> None:
        self.calibrate_at_start(models)
        while True:
            if not len(self._queue):
                self.working(False)  # the other lane may take the cores while this one waits
            if (job := self._queue.get(block=True)) is None:
                break
            self._begin(models, job)
            while self.run is not None:
                self.working(True)
                self.round()

    # --- one round at a time (this lane's thread, or the shared worker's) ----------------

    @property
    def busy(self) -> bool:
        """A request being decoded, or waiting for its turn."""
        return self.run is not None or len(self._queue) > 0

    def take(self, models: Models) -> bool:
        """Start the next queued request if none is being decoded; False if there is none."""
        if self.run is None and (job := self._queue.get(block=False)) is not None:
            self._begin(models, job)
        return self.run is not None

    def round(self) -> None:
        """One draft-and-verify round (or one prefill chunk) of the running request; answer
        it once it has ended."""
        run = self.run
        assert run is not None
        try:
            event = run.advance()
        except Exception as e:
            event = generation_failed(e)
            run.close()
        if event is not None:
            self.run = None
            self.active = 0
            self._answer(run.job, event)

    def _begin(self, models: Models, job: Job) -> None:
        self.active = 1
        try:
            self.run = SpecRun(self, models, job)
        except Exception as e:
            self.active = 0
            self._answer(job, generation_failed(e))

    def fetch(
        self, key: str, model: Any, tokens: list[int], partition: str
    ) -> tuple[list[Any], int]:
        """A cache for ``model`` holding a prefix of ``tokens`` (shorter than all of them),
        from ``partition``'s entries."""
        from mlx_lm.models.cache import make_prompt_cache

        counters = self.cache_counters if key == TARGET else None
        lookup = self.prompt_cache.fetch(tokens, partition, model=key, counters=counters)
        if lookup.cache is None:
            return make_prompt_cache(model), 0
        return lookup.cache, lookup.cached_tokens

    def store(
        self,
        key: str,
        tokens: list[int],
        cache: list[Any],
        partition: str,
        segments: tuple[Segment, ...] = (),
    ) -> None:
        self.prompt_cache.store(tokens, cache, partition, model=key, segments=segments)


class SpecRun:
    """One request on the speculative lane, advanced one round at a time."""

    def __init__(self, engine: SpeculativeEngine, models: Models, job: Job) -> None:
        import mlx.core as mx

        self.engine = engine
        self.job = job
        self.aborted = job.cancelled.is_set()
        self.decoding = False  # a token was emitted: the cache follows the history
        self.reason = "length"
        self.draft_model: DraftModel | None = None
        self.prediction: PredictionDraft | None = None
        self.chooser: Chooser | None = None
        self.steps: Iterator[Step] = iter(())
        request = job.request
        if self.aborted:
            return
        if request.seed is not None:
            mx.random.seed(request.seed)
        chosen = engine.plan(request)
        forced_only = "forced" if chosen.forced else None
        self.progress = SpecProgress(job, models.tokenizer, chosen.source or forced_only)
        self.progress.k = max(chosen.k, chosen.forced)
        self.history = list(job.prompt_ids)
        self.cache, self.cached = engine.fetch(TARGET, models.model, self.history, job.partition)
        candidates = self._candidates(models, chosen)
        # A constrained request fills the gaps between its grammar's forced runs from one
        # source (``gap_filler``).
        filler = gap_filler(candidates)
        propose: Propose | None = None
        if filler is not None:
            take = filler.propose
            propose = lambda history, prompt_len, k: take(history, k)  # noqa: E731
        paced = not (chosen.source == DRAFT_MODEL)  # a draft model named by hand drafts
        self.chooser = Chooser(candidates, engine.pass_cost, engine.draft_cost, paced=paced)
        constraint: ConstraintDraft | None = None
        if chosen.forced:
            constraint = ConstraintDraft.for_constraint(
                request.constraint, len(self.history), job.constraint_failed
            )
        self.steps = decode(
            models.model,
            self.cache,
            self.history,
            self.cached,
            max_tokens=request.budget,
            sampler=sampler_for(request),
            processors=()
            if constraint is not None
            else processors_for(request, job.constraint_failed),
            propose=propose,
            k=filler.most if filler is not None else 0,
            stop_tokens=self.progress.eos,
            constraint=constraint,
            forced_k=chosen.forced,
            chooser=self.chooser if constraint is None else None,
            top_logprobs=request.logprobs,
        )

    def _candidates(self, models: Models, chosen: Plan) -> list[DraftCandidate]:
        """The sources this request may draft from: all the lane has under ``auto``, else
        the one chosen; each with its partition's carried acceptance."""
        engine, job = self.engine, self.job
        settings = engine.settings
        names: list[str]
        if chosen.source == "auto":
            names = ["prediction"] if job.request.prediction else []
            names += ["prompt_lookup", "suffix"]
            if models.draft is not None and settings.num_draft_tokens:
                engine.calibrate(models)
                if engine.draft_pays(min(chosen.k, settings.num_draft_tokens)):
                    names.append(DRAFT_MODEL)
        else:
            names = [chosen.source] if chosen.source is not None else []
        out = []
        for name in names:
            propose, most, grade = self._proposer(models, name)
            acceptance = engine.evidence.acceptance(job.partition, name)
            out.append(DraftCandidate(name, propose, min(most, chosen.k), acceptance, grade=grade))
        return out

    def _proposer(self, models: Models, name: str) -> tuple[FreePropose, int, Grade | None]:
        engine, job = self.engine, self.job
        settings = engine.settings
        prompt_len = len(job.prompt_ids)
        if name == "prediction":
            prediction = self.prediction = PredictionDraft(job.prediction_ids, settings.prediction)
            propose = lambda h, k: prediction.propose(h[prompt_len:], k)  # noqa: E731
            return propose, settings.prediction.max_draft, None
        if name == "prompt_lookup":
            lookup = PromptLookup(settings.lookup)
            return lookup.propose, settings.lookup.max_draft, lookup.grade
        if name == "suffix":
            suffix = SuffixDraft(engine.suffix, job.partition)
            return suffix.propose, settings.suffix.max_draft, suffix.grade
        draft_cache, draft_cached = engine.fetch(DRAFT, models.draft, self.history, job.partition)
        cost = engine.draft_cost

        def timed(passes: int, seconds: float) -> None:
            cost.observe(passes, seconds, engine.pass_cost.plain(1))

        draft = self.draft_model = DraftModel(
            models.draft, draft_cache, self.history[:draft_cached], timed
        )
        return lambda h, k: draft.propose(h, prompt_len, k), settings.num_draft_tokens, None

    def advance(self) -> Event | None:
        """Run one step; the job's answer once it has ended, else None."""
        if self.aborted:
            return aborted()
        step = next(self.steps, None)
        if step is None:
            return self._end()
        # a prefill chunk or a step's tokens: what /health shows moving (never on a stuck thread)
        self.engine.progress_tokens += max(1, len(step.tokens))
        self.decoding = self.decoding or bool(step.tokens)
        if self.progress.step(step):
            self.reason = "stop"
            return self._end()
        if self.job.cancelled.is_set():
            self.aborted = True
            return self._end()
        return None

    def close(self) -> None:
        """After a failed step: drop the generator (a pass that raised may have left the cache
        half-written, so nothing is stored)."""
        close = getattr(self.steps, "close", None)
        if close is not None:
            close()

    def _end(self) -> Event:
        self.close()
        if self.decoding:  # before that the cache may hold only part of the prompt
            job = self.job
            self.engine.store(TARGET, self.history[:-1], self.cache, job.partition, job.segments)
        if self.draft_model is not None:
            self.engine.store(
                DRAFT,
                self.draft_model.cached,
                self.draft_model.cache,
                self.job.partition,
                self.job.segments,
            )
        if self.aborted:
            return aborted()
        self.engine.suffix.insert(self.job.partition, self.history)
        if self.chooser is not None:
            self.engine.evidence.record(self.job.partition, self.chooser.acceptances())
        return self.progress.finish(self.reason, self.cached, self.prediction, self.chooser)
