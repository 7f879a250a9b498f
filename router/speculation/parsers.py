"""Per-response draft statistics, read from each backend's own response shape (pure).

``parse_response(kind, body)`` reads a non-streaming JSON body; ``parse_stream_events(kind,
events)`` reads the last few parsed SSE JSON events of a stream (the statistics ride on
the final usage chunk, ``choices: []``, or on the chunk carrying ``finish_reason``,
depending on the backend: both are tried, newest first); the table in
docs/speculation.md says where each backend puts its figures. Neither function raises: bad
input gives ``Malformed`` with a closed-vocabulary reason, missing input ``NotReported``.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from typing import Any

from router.config.kinds import KINDS
from router.kernel.worker_contract import STREAM_USAGE_FIELD
from router.speculation.fields import (
    MAPPING,
    BadField,
    Payload,
    count,
    first_count,
    histogram,
    per_position_from,
    ratio,
    section,
)
from router.speculation.record import (
    Malformed,
    NotReported,
    SpecKind,
    SpecRecord,
    SpecResult,
    build_record,
)

Parser = Callable[[Payload], SpecResult]


def _result(source: str, kind: SpecKind, **fields: Any) -> SpecResult:
    record = build_record(source, "request", kind, **fields)
    if isinstance(record, SpecRecord) and record.drafted == 0:
        return NotReported(source, "no_draft")
    return record


# --- one parser per backend kind -------------------------------------------------------

_LMS_COUNTS = (
    "total_draft_tokens_count",
    "accepted_draft_tokens_count",
    "rejected_draft_tokens_count",
    "ignored_draft_tokens_count",
)


def parse_lmstudio(body: Payload) -> SpecResult:
    """``stats`` on /v1 (``{}`` when no draft ran), the same counts in ``usage`` on /api/v0."""
    stats = section(body, "stats")
    usage = section(body, "usage")
    for place in (stats, usage):
        if place is not None and any(name in place for name in _LMS_COUNTS):
            return _lmstudio_counts(place)
    # A stats object without counts ({} on /v1, clock-only on /api/v0): no draft ran.
    return NotReported("lmstudio", "no_draft" if stats is not None else "absent")


def _lmstudio_counts(place: Payload) -> SpecResult:
    drafted = count(place, "total_draft_tokens_count")
    accepted = count(place, "accepted_draft_tokens_count")
    rejected = count(place, "rejected_draft_tokens_count")
    ignored = count(place, "ignored_draft_tokens_count")
    computed = []
    # Often left out, although the total includes the ignored drafts.
    if ignored is None and drafted is not None and accepted is not None and rejected is not None:
        if drafted - accepted - rejected >= 0:
            ignored = drafted - accepted - rejected
            computed.append("ignored")
    return _result(
        "lmstudio",
        "draft",
        drafted=drafted,
        accepted=accepted,
        rejected=rejected,
        ignored=ignored,
        computed=computed,
    )


def _count_pair(
    source: str, kind: SpecKind, place: Payload, drafted_name: str, accepted_name: str
) -> SpecResult:
    """A drafted/accepted pair that is absent when nothing was drafted, never half there."""
    drafted, accepted = count(place, drafted_name), count(place, accepted_name)
    if drafted is None and accepted is None:
        return NotReported(source, "no_draft")
    if drafted is None or accepted is None:
        raise BadField("incomplete", drafted_name if drafted is None else accepted_name)
    return _result(source, kind, drafted=drafted, accepted=accepted)


def parse_llamacpp(body: Payload) -> SpecResult:
    """``timings.draft_n`` / ``draft_n_accepted``, present only when something was drafted."""
    timings = section(body, "timings")
    if timings is None:
        return NotReported("llamacpp", "absent")
    return _count_pair("llamacpp", "draft", timings, "draft_n", "draft_n_accepted")


def parse_vllm(body: Payload) -> SpecResult:
    """``metrics.speculative_decoding`` (vLLM with --per-request-spec-decode-metrics)."""
    metrics = section(body, "metrics")
    if metrics is None:
        return NotReported("vllm", "absent")
    spec = section(metrics, "speculative_decoding")
    if spec is None:
        return NotReported("vllm", "no_draft")
    hist = histogram(spec.get("acceptance_histogram"))
    steps = count(spec, "num_spec_steps")
    computed = []
    if steps is None and hist:
        steps = sum(hist.values())
        computed.append("steps")
    per_position = per_position_from(hist) if hist else ()
    if per_position:
        computed.append("per_position")
    return _result(
        "vllm",
        "draft",
        drafted=count(spec, "num_draft_tokens"),
        accepted=count(spec, "num_accepted_draft_tokens"),
        steps=steps,
        acceptance_rate=ratio(spec, "draft_acceptance_rate"),
        mean_accept_len=ratio(spec, "mean_acceptance_length"),
        per_position=per_position,
        computed=computed,
    )


_SGLANG_META = (
    "spec_verify_ct",
    "spec_num_correct_drafts",
    "spec_accepted_drafts",
    "spec_accept_token_num",
    "spec_num_proposed_drafts",
    "spec_proposed_drafts",
    "spec_draft_token_num",
)


def parse_sglang(body: Payload) -> SpecResult:
    """Native ``meta_info.spec_*``, or OpenAI ``usage.completion_tokens_details``."""
    meta = section(body, "meta_info")
    if meta is not None and any(name in meta for name in _SGLANG_META):
        return _sglang_meta(meta)
    details = _completion_details(body)
    if details is not None and _has_prediction_counts(details):
        return _prediction_counts("sglang", "draft", details)
    return NotReported("sglang", "no_draft" if meta is not None else "absent")


def _sglang_meta(meta: Payload) -> SpecResult:
    steps = count(meta, "spec_verify_ct")
    accepted = first_count(
        meta, "spec_num_correct_drafts", "spec_accepted_drafts", "spec_accept_token_num"
    )
    drafted = first_count(
        meta, "spec_num_proposed_drafts", "spec_proposed_drafts", "spec_draft_token_num"
    )
    if not steps and not accepted and not drafted:
        return NotReported("sglang", "no_draft")
    computed = []
    if accepted is None and steps:
        # Each verification round emits one token of its own plus the accepted drafts.
        completion = count(meta, "completion_tokens")
        if completion is not None and completion >= steps:
            accepted = completion - steps
            computed.append("accepted")
    if drafted is None:
        raise BadField("incomplete", "spec_num_proposed_drafts")
    hist = histogram(meta.get("spec_correct_drafts_histogram", meta.get("spec_accept_histogram")))
    per_position = per_position_from(hist) if hist else ()
    if per_position:
        computed.append("per_position")
    return _result(
        "sglang",
        "draft",
        drafted=drafted,
        accepted=accepted,
        steps=steps,
        acceptance_rate=ratio(meta, "spec_accept_rate"),
        mean_accept_len=ratio(meta, "spec_accept_length"),
        per_position=per_position,
        computed=computed,
    )


def parse_vllm_mlx(body: Payload) -> SpecResult:
    """Top-level ``generation_metadata`` (null without MTP activity; non-streaming only)."""
    if "generation_metadata" not in body:
        return NotReported("vllm_mlx", "absent")
    meta = section(body, "generation_metadata")
    if meta is None:
        return NotReported("vllm_mlx", "no_draft")
    return _count_pair("vllm_mlx", "mtp", meta, "mtp_drafts", "mtp_accepted")


SPECLANE_DRAFT_SOURCES = frozenset(
    {"auto", "draft_model", "prompt_lookup", "suffix", "prediction", "forced"}
)
# The sources one response may break its drafts down by (a closed set: metric labels).
SPECLANE_STEP_SOURCES = frozenset({"draft_model", "prompt_lookup", "suffix", "prediction"})


def parse_speclane(body: Payload) -> SpecResult:
    """speclane's own worker: ``usage.speclane_spec`` on every response (worker-contract.md);
    on a stream whose client asked for no usage, the finish chunk's ``STREAM_USAGE_FIELD``."""
    usage = _speclane_usage(body)
    if usage is None:
        return NotReported("speclane", "absent")
    spec = section(usage, "speclane_spec")
    if spec is None:
        raise BadField("incomplete", "speclane_spec")
    if not count(spec, "num_draft_tokens") and not count(spec, "drafted"):
        return NotReported("speclane", "no_draft")
    plain_steps = count(spec, "plain_steps")
    by_source = _speclane_sources(spec)
    result = _result(
        "speclane",
        "draft",
        drafted=count(spec, "drafted"),
        accepted=count(spec, "accepted"),
        rejected=count(spec, "rejected"),
        steps=count(spec, "steps"),
    )
    if isinstance(result, NotReported) and plain_steps:
        return NotReported("speclane", "declined")
    source = spec.get("source")
    if isinstance(result, SpecRecord) and source in SPECLANE_DRAFT_SOURCES:
        result = dataclasses.replace(result, draft_source=source, by_source=by_source)
    return result


def _speclane_usage(body: Payload) -> Payload | None:
    usage = section(body, "usage")
    return usage if usage is not None else section(body, STREAM_USAGE_FIELD)


def _speclane_sources(spec: Payload) -> tuple[tuple[str, int, int], ...]:
    """``speclane_spec.sources``: what each source drafted and had kept (known names only;
    at most one entry per source)."""
    sources = section(spec, "sources")
    if sources is None:
        return ()
    out = []
    for name in sorted(SPECLANE_STEP_SOURCES):
        entry = section(sources, name)
        if entry is None:
            continue
        drafted, accepted = count(entry, "drafted") or 0, count(entry, "accepted") or 0
        if accepted > drafted:
            raise BadField("inconsistent", f"sources.{name}")
        out.append((name, drafted, accepted))
    return tuple(out)


def parse_openai(body: Payload) -> SpecResult:
    """Any OpenAI-compatible server: a backend's own figures when recognisable, else
    Predicted Outputs' ``accepted/rejected_prediction_tokens`` (user predictions)."""
    for parser in (parse_speclane, parse_llamacpp, parse_vllm, parse_lmstudio, parse_vllm_mlx):
        if _recognised(parser, body):
            result = parser(body)
            if isinstance(result, SpecRecord | Malformed):
                return result
    details = _completion_details(body)
    if details is not None and _has_prediction_counts(details):
        return _prediction_counts("openai", "predicted_output", details)
    return NotReported("openai", "absent")


def _recognised(parser: Parser, body: Payload) -> bool:
    """Only let a backend's parser speak for a generic server when its fields are there."""
    if parser is parse_speclane:
        return any(
            isinstance(usage, MAPPING) and "speclane_spec" in usage
            for usage in (body.get("usage"), body.get(STREAM_USAGE_FIELD))
        )
    if parser is parse_lmstudio:
        return any(
            isinstance(place, MAPPING) and any(n in place for n in _LMS_COUNTS)
            for place in (body.get("stats"), body.get("usage"))
        )
    if parser is parse_vllm_mlx:
        return isinstance(body.get("generation_metadata"), MAPPING)
    return True  # llama.cpp timings and vLLM metrics have unambiguous names


def _silent(source: str) -> Parser:
    def parse(body: Payload) -> SpecResult:
        return NotReported(source, "not_supported")

    return parse


def _completion_details(body: Payload) -> Payload | None:
    usage = section(body, "usage")
    return None if usage is None else section(usage, "completion_tokens_details")


def _has_prediction_counts(details: Payload) -> bool:
    return "accepted_prediction_tokens" in details or "rejected_prediction_tokens" in details


def _prediction_counts(source: str, kind: SpecKind, details: Payload) -> SpecResult:
    accepted = count(details, "accepted_prediction_tokens")
    rejected = count(details, "rejected_prediction_tokens")
    if accepted is None or rejected is None:
        missing = "accepted_prediction_tokens" if accepted is None else "rejected_prediction_tokens"
        raise BadField("incomplete", missing)
    return _result(source, kind, accepted=accepted, rejected=rejected)


# Backends that never put draft statistics on the wire, whatever they run inside.
SILENT_KINDS = frozenset(name for name, facts in KINDS.items() if facts.silent)

PARSERS: dict[str, Parser] = {
    "openai": parse_openai,
    "mlx_lm": _silent("mlx_lm"),
    "lmstudio": parse_lmstudio,
    "llamacpp": parse_llamacpp,
    "ollama": _silent("ollama"),
    "vllm": parse_vllm,
    "vllm_mlx": parse_vllm_mlx,
    "sglang": parse_sglang,
    "speclane": parse_speclane,
}


# The top-level fields each kind's parser reads (router.config.kinds). An event that has none
# of them carries no statistics: every parser answers "absent" for it, which never changes a
# stream's result. Skipping such events (a stream's content chunks) without running the
# parsers is most of what reading a stream's statistics costs per request.
_STAT_FIELDS: dict[str, frozenset[str]] = {name: facts.stat_fields for name, facts in KINDS.items()}


# --- the two entry points ----------------------------------------------------------------


def parse_response(kind: str, body: Any) -> SpecResult:
    """Draft statistics of one non-streaming response body (already JSON-decoded)."""
    parser = PARSERS.get(kind)
    if parser is None or kind in SILENT_KINDS:
        return NotReported(kind, "not_supported")
    if not isinstance(body, MAPPING):
        return Malformed(kind, "not_object")
    try:
        return parser(body)
    except BadField as bad:
        return Malformed(kind, bad.reason, bad.field)
    except Exception:
        # A parser bug must never fail the request it rode on; tests fuzz for this reason.
        return Malformed(kind, "parser_error")


def parse_stream_events(kind: str, events: Sequence[Any]) -> SpecResult:
    """Draft statistics of a stream, from its last parsed SSE JSON events (oldest first).

    The newest event that carries statistics wins (llama.cpp and speclane repeat or grow
    them; the last is the whole answer's). Without one: ``Malformed`` if any event had bad
    statistics, else ``no_draft`` if any event said so, else ``absent``.
    """
    if kind not in PARSERS or kind in SILENT_KINDS:
        return NotReported(kind, "not_supported")
    fallback: SpecResult = NotReported(kind, "absent")
    fields = _STAT_FIELDS[kind]
    for event in reversed(events):
        if not isinstance(event, MAPPING) or fields.isdisjoint(event):
            continue
        result = parse_response(kind, event)
        if isinstance(result, SpecRecord):
            return result
        if isinstance(result, Malformed):
            if not isinstance(fallback, Malformed):
                fallback = result
        elif result.reason == "no_draft" and isinstance(fallback, NotReported):
            fallback = result
    return fallback


_OUTPUT_COUNTS = (
    ("usage", "completion_tokens"),
    (STREAM_USAGE_FIELD, "completion_tokens"),
    ("timings", "predicted_n"),
    ("meta_info", "completion_tokens"),
    (None, "tokens_predicted"),
    (None, "eval_count"),
)


def output_tokens(body: Any) -> int | None:
    """The completion token count the backend reports, where any backend puts it."""
    if not isinstance(body, MAPPING):
        return None
    for where, name in _OUTPUT_COUNTS:
        place = body if where is None else body.get(where)
        if place is not None and isinstance(place, MAPPING):
            try:
                value = count(place, name)
            except BadField:
                continue
            if value is not None:
                return value
    return None
