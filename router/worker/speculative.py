"""The speculative lane: one request at a time, its own decode loop, pluggable draft sources.

Every step feeds the last emitted token plus up to k draft tokens through the target in one
forward pass (on a CPU that costs little more than decoding one token), samples the target at
every position, emits the longest run where the target's sample equals the draft plus the
target's own next token, and trims the rejected positions off the KV cache (mlx-lm's
``trim_prompt_cache``). Lossless by construction: every emitted token is the target's own
sample given exactly the emitted prefix, so greedy output is token for token that of plain
decoding, and with sampling each token is drawn from the target's distribution (a draft token
is only a guess the target's sample must reproduce).

Draft sources (``router.worker.drafts`` for the pure ones):
- ``draft_model``: a small model decodes k tokens greedily on its own KV cache, kept in step.
- ``prompt_lookup``: n-gram lookup in the prompt and the output so far.
- ``prediction``: the request's OpenAI ``prediction`` content, re-aligned on divergence.
- ``suffix``: n-gram lookup in earlier requests' prompts and answers of the same client
  partition (``router.worker.suffix``), and in the request's own context. Every finished
  request is indexed, whatever it drafted with, so a plain first answer drafts its retry.

A request chooses its source with the ``draft_source`` field (``draft_model``,
``prompt_lookup`` or ``suffix``; the router sets it per request family); a ``prediction``
still wins.

A constrained request (tool calls, ``json_schema``) drafts the tokens its grammar forces
(``router.worker.forced``), else from its source, every position verified under the grammar's
mask; ``usage.speclane_spec.forced`` counts the forced tokens kept. A request with other logits
processors (penalties, logit bias) decodes plainly: they depend on every previous token, and
drafting around them is not worth the risk.

Prompt cache: the KV cache of earlier requests (target and draft model, each under its own key)
is reused for the longest common token prefix (mlx-lm's ``LRUPromptCache``, bounded in bytes),
only between requests of the same partition (``router.worker.promptcache.entry_key``).
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable, Generator, Sequence
from dataclasses import dataclass, field
from typing import Any, cast

from router.worker.contract import DRAFT_SOURCES
from router.worker.drafts import LookupConfig, PredictionConfig, PredictionDraft, PromptLookup
from router.worker.engine import Engine, Models, generation_failed, processors_for, sampler_for
from router.worker.forced import FORCED_MAX_DRAFT, ConstraintDraft
from router.worker.jobs import Event, Finished, Job, TextDelta, aborted
from router.worker.promptcache import entry_key
from router.worker.protocol import GenerationRequest
from router.worker.stats import SpecStats, usage
from router.worker.stops import StopScanner
from router.worker.suffix import SuffixConfig, SuffixDraft, SuffixIndex

log = logging.getLogger("speclane.worker")

SOURCES = DRAFT_SOURCES
PREFILL_STEP = 512
PROMPT_CACHE_ENTRIES = 64  # the byte bound is the one that matters; this caps trie size
TARGET_KEY = "target"  # LRUPromptCache namespaces: the two models' caches never mix
DRAFT_KEY = "draft"

Propose = Callable[[list[int], int, int], list[int]]  # (history, prompt_len, k) -> draft


@dataclass(frozen=True)
class SpecSettings:
    draft_source: str = "draft_model"  # the lane's source for requests without a prediction
    num_draft_tokens: int = 3  # draft_model's k
    lookup: LookupConfig = field(default_factory=LookupConfig)
    prediction: PredictionConfig = field(default_factory=PredictionConfig)
    prompt_cache_bytes: int = 512 << 20  # 0: no prompt cache
    suffix: SuffixConfig = field(default_factory=SuffixConfig)

    def __post_init__(self) -> None:
        if self.draft_source not in SOURCES:
            raise ValueError(f"draft source must be one of {', '.join(SOURCES)}")


@dataclass(frozen=True)
class Plan:
    source: str | None  # None: no draft source (forced tokens only, or plain decoding)
    k: int
    forced: int = 0  # a constrained request: its grammar's forced tokens drafted per step


def plan(
    request: GenerationRequest, settings: SpecSettings, has_draft: bool, has_processors: bool,
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


def _source_plan(request: GenerationRequest, settings: SpecSettings, has_draft: bool,
                 capped: Callable[[int], int]) -> Plan:
    if request.prediction:
        return Plan("prediction", capped(settings.prediction.max_draft))
    source = request.draft_source or settings.draft_source
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
    import mlx.core as mx

    for start in range(0, len(tokens), PREFILL_STEP):
        model(mx.array(tokens[start : start + PREFILL_STEP], mx.uint32)[None], cache=cache)
        mx.eval([c.state for c in cache])


def common_prefix(a: Sequence[int], b: Sequence[int]) -> int:
    n = 0
    for x, y in zip(a, b, strict=False):
        if x != y:
            break
        n += 1
    return n


class DraftModel:
    """A draft model proposing k greedy tokens; its cache follows the accepted history."""

    def __init__(self, model: Any, cache: list[Any], cached: list[int]) -> None:
        self.model = model
        self.cache = cache
        self.cached = cached  # the tokens in ``cache``

    def propose(self, history: list[int], prompt_len: int, k: int) -> list[int]:
        import mlx.core as mx
        from mlx_lm.models.cache import trim_prompt_cache

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
        return tokens


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
) -> Generator[Step, None, None]:
    """Generate after ``history`` (the prompt), of which ``cache`` holds the first ``cached``.

    ``history`` grows in place with every emitted token; when the generator ends (or is
    closed) the cache holds exactly ``history[:-1]``, ready for the prompt cache.
    ``constraint``: every position is masked by the grammar (instead of ``processors``), and
    up to ``forced_k`` forced tokens are the draft when there are any.
    """
    import mlx.core as mx
    from mlx_lm.models.cache import trim_prompt_cache

    if not 0 <= cached < len(history):
        raise ValueError("the cache must leave at least one prompt token to feed")
    prompt_len = len(history)
    prefill(model, cache, history[cached:-1])
    produced = 0
    while produced < max_tokens:
        budget = max_tokens - produced
        draft: list[int] = []
        if constraint is not None and budget > 1:
            draft = constraint.forced(history, min(forced_k, budget - 1))
        forced = len(draft)
        if not draft and propose is not None and k > 0 and budget > 1:
            draft = propose(history, prompt_len, min(k, budget - 1))
        inputs = mx.array(history[-1:] + draft, mx.uint32)
        logits = model(inputs[None], cache=cache)[0]  # (1 + len(draft), vocab)
        if constraint is not None:
            allowed = constraint.masks(history, draft, logits.shape[-1])
            logits = mx.where(mx.array(allowed), logits, -mx.inf)
        elif processors:  # only ever without a draft: one row
            context = mx.array(history, mx.uint32)
            for processor in processors:
                logits = processor(context, logits)
        logprobs = logits - mx.logsumexp(logits, axis=-1, keepdims=True)
        sampled: list[int] = sampler(logprobs).tolist()
        n = 0
        while n < len(draft) and sampled[n] == draft[n]:
            n += 1
        emitted = sampled[: n + 1]
        for i, token in enumerate(emitted):
            if token in stop_tokens:
                emitted = emitted[: i + 1]
                break
        history.extend(emitted)
        produced += len(emitted)
        # The cache took 1 + len(draft) positions; keep those of history[:-1] only.
        trim_prompt_cache(cache, len(draft) + 1 - len(emitted))
        accepted = min(n, len(emitted))
        yield Step(emitted, accepted, len(draft), accepted if forced else 0)
        if emitted[-1] in stop_tokens:
            return


# --- the engine -----------------------------------------------------------------------------


class SpecProgress:
    """One job's output: detokenizing, stop strings, counting, the usage object."""

    def __init__(self, job: Job, tokenizer: Any, source: str | None) -> None:
        self.job = job
        self.source = source
        self.detokenizer = tokenizer.detokenizer
        self.eos = frozenset(tokenizer.eos_token_ids)
        self.scanner = StopScanner(job.request.stop)
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
        for token in step.tokens:
            self.tokens += 1
            if token in self.eos:
                return True
            self.detokenizer.add_token(token)
            if out := self.scanner.feed(self.detokenizer.last_segment):
                self.job.emit(TextDelta(out))
            if self.scanner.stopped:
                return True
        return False

    def finish(
        self, reason: str, cached_tokens: int, prediction: PredictionDraft | None
    ) -> Finished:
        self.detokenizer.finalize()
        if not self.scanner.stopped and (out := self.scanner.feed(self.detokenizer.last_segment)):
            self.job.emit(TextDelta(out))
        if tail := self.scanner.flush():
            self.job.emit(TextDelta(tail))
        if self.scanner.stopped:
            reason = "stop"
        stats = SpecStats(self.drafted, self.accepted, self.steps, self.k)
        body = usage(len(self.job.prompt_ids), self.tokens, stats)
        spec = body["speclane_spec"]
        assert isinstance(spec, dict)
        spec["source"] = self.source
        spec["forced"] = self.forced  # accepted draft tokens the grammar forced
        if prediction is not None:  # OpenAI's meaning: prediction tokens (not) in the output
            body["completion_tokens_details"] = {
                "accepted_prediction_tokens": prediction.matched,
                "rejected_prediction_tokens": prediction.unmatched,
            }
        body["prompt_tokens_details"] = {"cached_tokens": cached_tokens}
        return Finished(reason, body)


class SpeculativeEngine(Engine):
    capacity = 1

    def __init__(self, load: Callable[[], Models], settings: SpecSettings) -> None:
        super().__init__(load)
        self.settings = settings
        self.prompt_cache: Any = None
        # Earlier requests' prompts and answers, per client partition (generation thread only).
        self.suffix = SuffixIndex(settings.suffix)

    @property
    def num_draft_tokens(self) -> int:
        return self.settings.num_draft_tokens

    def report(self) -> dict[str, object]:
        """The suffix index's size for /health (plain ints, read from the event loop)."""
        index = self.suffix
        return {"suffix_index": {"entries": len(index), "bytes": index.bytes,
                                 "max_bytes": index.config.max_bytes, "evicted": index.evicted}}

    def plan(self, request: GenerationRequest) -> Plan:
        has_draft = self.models is not None and self.models.draft is not None
        others = processors_for(dataclasses.replace(request, constraint=None))
        return plan(request, self.settings, has_draft, bool(others),
                    constrained=request.constraint is not None)

    def _serve(self, models: Models) -> None:
        if self.settings.prompt_cache_bytes > 0:
            from mlx_lm.models.cache import LRUPromptCache

            limit = self.settings.prompt_cache_bytes
            self.prompt_cache = LRUPromptCache(max_size=PROMPT_CACHE_ENTRIES, max_bytes=limit)
        while (job := self._queue.get(block=True)) is not None:
            self.active = 1
            try:
                self._answer(job, self._generate(models, job))
            except Exception as e:
                log.exception("generation failed")
                self._answer(job, generation_failed(e))
            finally:
                self.active = 0

    def _fetch(self, key: tuple[str, str], model: Any,
               tokens: list[int]) -> tuple[list[Any], int]:
        """A cache for ``model`` holding a prefix of ``tokens`` (shorter than all of them)."""
        from mlx_lm.models.cache import (
            can_trim_prompt_cache,
            make_prompt_cache,
            trim_prompt_cache,
        )

        if self.prompt_cache is not None:
            cache, rest = self.prompt_cache.fetch_nearest_cache(key, tokens)
            if cache is not None:
                cached = len(tokens) - len(rest)
                if cached < len(tokens):
                    return cache, cached
                if can_trim_prompt_cache(cache):  # all of it: give the last token back
                    trim_prompt_cache(cache, 1)
                    return cache, cached - 1
        return make_prompt_cache(model), 0

    def _store(self, key: tuple[str, str], tokens: list[int], cache: list[Any]) -> None:
        if self.prompt_cache is not None and tokens:
            self.prompt_cache.insert_cache(key, list(tokens), cache)

    def _generate(self, models: Models, job: Job) -> Event:
        import mlx.core as mx

        request = job.request
        if job.cancelled.is_set():
            return aborted()
        if request.seed is not None:
            mx.random.seed(request.seed)
        chosen = self.plan(request)
        forced_only = "forced" if chosen.forced else None
        progress = SpecProgress(job, models.tokenizer, chosen.source or forced_only)
        progress.k = max(chosen.k, chosen.forced)
        history = list(job.prompt_ids)
        target_key = entry_key(TARGET_KEY, job.partition)
        draft_key = entry_key(DRAFT_KEY, job.partition)
        cache, cached = self._fetch(target_key, models.model, history)
        propose: Propose | None = None
        prediction: PredictionDraft | None = None
        draft_model: DraftModel | None = None
        if chosen.source == "prediction":
            prediction = PredictionDraft(job.prediction_ids, self.settings.prediction)
            propose = prediction_proposer(prediction)
        elif chosen.source == "prompt_lookup":
            propose = lookup_proposer(self.settings.lookup)
        elif chosen.source == "suffix":
            propose = suffix_proposer(SuffixDraft(self.suffix, job.partition))
        elif chosen.source == "draft_model":
            draft_cache, draft_cached = self._fetch(draft_key, models.draft, history)
            draft_model = DraftModel(models.draft, draft_cache, history[:draft_cached])
            propose = draft_model.propose
        constraint: ConstraintDraft | None = None
        if chosen.forced:
            constraint = ConstraintDraft.for_constraint(request.constraint, len(history),
                                                        job.constraint_failed)
        steps = decode(
            models.model,
            cache,
            history,
            cached,
            max_tokens=request.budget,
            sampler=sampler_for(request),
            processors=() if constraint is not None else processors_for(request,
                                                                        job.constraint_failed),
            propose=propose,
            k=chosen.k,
            stop_tokens=progress.eos,
            constraint=constraint,
            forced_k=chosen.forced,
        )
        reason = "length"
        try:
            for step in steps:
                if progress.step(step):
                    reason = "stop"
                    break
                if job.cancelled.is_set():
                    reason = "aborted"
                    break
        finally:
            steps.close()
        # Only after a clean run: a pass that raised may have left the cache half-written.
        self._store(target_key, history[:-1], cache)
        if draft_model is not None:
            self._store(draft_key, draft_model.cached, draft_model.cache)
        if reason == "aborted":
            return aborted()
        self.suffix.insert(job.partition, history)
        return progress.finish(reason, cached, prediction)
