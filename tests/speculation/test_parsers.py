"""Each backend's statistics, from bodies and streams shaped like its own."""

from __future__ import annotations

import typing

import pytest

from router.config.settings import BackendKind
from router.speculation.parsers import PARSERS, output_tokens, parse_response, parse_stream_events
from router.speculation.record import Malformed, NotReported, SpecRecord
from tests.speculation import payloads as p


def record(result: object) -> SpecRecord:
    assert isinstance(result, SpecRecord), result
    return result


def test_every_configured_backend_kind_and_speclane_has_a_parser() -> None:
    assert set(PARSERS) == {*typing.get_args(BackendKind), "speclane"}


# --- LM Studio -------------------------------------------------------------------------------


def test_lmstudio_v1_stats() -> None:
    r = record(parse_response("lmstudio", p.lmstudio_v1()))
    assert (r.source, r.scope, r.kind) == ("lmstudio", "request", "draft")
    assert (r.drafted, r.accepted, r.rejected, r.ignored) == (150, 96, 50, 4)
    assert r.acceptance_rate == pytest.approx(96 / 150)
    assert r.steps is None and r.mean_accept_len is None
    assert r.reported == {"drafted", "accepted", "rejected", "ignored"}
    assert r.derived == {"acceptance_rate"}


def test_lmstudio_ignored_left_out_is_derived_from_the_total() -> None:
    stats = {k: v for k, v in p.LMS_STATS.items() if not k.startswith("ignored")}
    r = record(parse_response("lmstudio", p.lmstudio_v1(stats)))
    assert (r.drafted, r.accepted, r.rejected, r.ignored) == (150, 96, 50, 4)
    assert "ignored" in r.derived


def test_lmstudio_empty_stats_means_no_draft_ran() -> None:
    assert parse_response("lmstudio", p.lmstudio_v1({})) == NotReported("lmstudio", "no_draft")


def test_lmstudio_api_v0_counts_under_usage() -> None:
    r = record(parse_response("lmstudio", p.lmstudio_api_v0()))
    assert (r.drafted, r.accepted, r.rejected, r.ignored) == (492, 176, 316, 0)


def test_lmstudio_without_stats_is_absent() -> None:
    body = p.lmstudio_v1()
    del body["stats"]
    assert parse_response("lmstudio", body) == NotReported("lmstudio", "absent")


ACCEPTED, REJECTED, TOTAL = (
    "accepted_draft_tokens_count",
    "rejected_draft_tokens_count",
    "total_draft_tokens_count",
)


@pytest.mark.parametrize(
    ("change", "reason", "field"),
    [
        ({ACCEPTED: "96"}, "bad_type", ACCEPTED),
        ({REJECTED: -1}, "negative", REJECTED),
        ({ACCEPTED: 200}, "inconsistent", None),
        ({TOTAL: True}, "bad_type", TOTAL),
        ({TOTAL: float("nan")}, "bad_type", TOTAL),
        ({TOTAL: 12.5}, "bad_type", TOTAL),
    ],
)
def test_lmstudio_malformed(change: dict, reason: str, field: str | None) -> None:
    stats = {**p.LMS_STATS, **change}
    assert parse_response("lmstudio", p.lmstudio_v1(stats)) == Malformed("lmstudio", reason, field)


def test_lmstudio_accepted_alone_is_incomplete() -> None:
    result = parse_response("lmstudio", p.lmstudio_v1({ACCEPTED: 5}))
    assert result == Malformed("lmstudio", "incomplete")


def test_lmstudio_integral_float_counts_are_accepted() -> None:
    r = record(parse_response("lmstudio", p.lmstudio_v1({**p.LMS_STATS, TOTAL: 150.0})))
    assert r.drafted == 150 and isinstance(r.drafted, int)


def test_lmstudio_stats_not_an_object() -> None:
    assert parse_response("lmstudio", p.lmstudio_v1([1, 2])) == Malformed(  # type: ignore[arg-type]
        "lmstudio", "not_object", "stats"
    )


@pytest.mark.parametrize("on_usage_chunk", [True, False])
def test_lmstudio_stream_either_placement(on_usage_chunk: bool) -> None:
    r = record(parse_stream_events("lmstudio", p.lmstudio_stream(on_usage_chunk)))
    assert (r.drafted, r.accepted) == (150, 96)


# --- llama.cpp -------------------------------------------------------------------------------


def test_llamacpp_chat_timings() -> None:
    r = record(parse_response("llamacpp", p.llamacpp_chat()))
    assert (r.drafted, r.accepted, r.rejected, r.ignored) == (347, 65, 282, 0)
    assert r.reported == {"drafted", "accepted"}
    assert r.acceptance_rate == pytest.approx(65 / 347)


def test_llamacpp_native_completion() -> None:
    r = record(parse_response("llamacpp", p.llamacpp_completion()))
    assert (r.drafted, r.accepted) == (120, 90)


def test_llamacpp_without_draft_fields_ran_no_draft() -> None:
    assert parse_response("llamacpp", p.llamacpp_chat(False)) == NotReported("llamacpp", "no_draft")


def test_llamacpp_without_timings_is_absent() -> None:
    body = p.llamacpp_chat()
    del body["timings"]
    assert parse_response("llamacpp", body) == NotReported("llamacpp", "absent")


def test_llamacpp_draft_n_alone_is_incomplete() -> None:
    body = p.llamacpp_chat()
    del body["timings"]["draft_n_accepted"]
    expected = Malformed("llamacpp", "incomplete", "draft_n_accepted")
    assert parse_response("llamacpp", body) == expected


def test_llamacpp_accepted_above_drafted_is_inconsistent() -> None:
    body = p.llamacpp_chat()
    body["timings"]["draft_n_accepted"] = 400
    assert parse_response("llamacpp", body) == Malformed("llamacpp", "inconsistent")


@pytest.mark.parametrize("include_usage", [True, False])
@pytest.mark.parametrize("per_token_timings", [True, False])
def test_llamacpp_stream_takes_the_last_timings(
    include_usage: bool, per_token_timings: bool
) -> None:
    events = p.llamacpp_stream(include_usage, per_token_timings)
    r = record(parse_stream_events("llamacpp", events))
    assert (r.drafted, r.accepted) == (347, 65)


# --- vLLM ------------------------------------------------------------------------------------


def test_vllm_per_request_metrics() -> None:
    r = record(parse_response("vllm", p.vllm_chat()))
    assert (r.drafted, r.accepted, r.rejected, r.steps) == (120, 84, 36, 40)
    assert r.acceptance_rate == 0.7 and r.mean_accept_len == 3.1
    # Rounds accepting j drafts cover positions 0..j-1: 35 reached position 0, 29 position 1...
    assert r.per_position == (35, 29, 20)
    assert sum(r.per_position) == r.accepted
    assert "per_position" in r.derived
    assert r.reported == {"drafted", "accepted", "steps", "acceptance_rate", "mean_accept_len"}


def test_vllm_steps_from_the_histogram_when_not_sent() -> None:
    spec = {k: v for k, v in p.VLLM_SPEC.items() if k != "num_spec_steps"}
    r = record(parse_response("vllm", p.vllm_chat(spec)))
    assert r.steps == 40 and "steps" in r.derived


def test_vllm_bad_histogram_is_dropped_not_fatal() -> None:
    r = record(parse_response("vllm", p.vllm_chat({**p.VLLM_SPEC, "acceptance_histogram": "x"})))
    assert r.per_position == () and r.drafted == 120


def test_vllm_out_of_range_rate_is_replaced_by_the_derived_one() -> None:
    r = record(parse_response("vllm", p.vllm_chat({**p.VLLM_SPEC, "draft_acceptance_rate": 7.0})))
    assert r.acceptance_rate == pytest.approx(0.7) and "acceptance_rate" in r.derived


def test_vllm_without_metrics_is_absent_and_without_spec_no_draft() -> None:
    assert parse_response("vllm", p.vllm_chat(metrics=False)) == NotReported("vllm", "absent")
    body = p.vllm_chat()
    body["metrics"] = {"speculative_decoding": None}
    assert parse_response("vllm", body) == NotReported("vllm", "no_draft")
    zero = {"num_draft_tokens": 0, "num_accepted_draft_tokens": 0, "num_spec_steps": 0}
    assert parse_response("vllm", p.vllm_chat(zero)) == NotReported("vllm", "no_draft")


def test_vllm_zero_steps_with_drafts_is_inconsistent() -> None:
    result = parse_response("vllm", p.vllm_chat({**p.VLLM_SPEC, "num_spec_steps": 0}))
    assert result == Malformed("vllm", "inconsistent", "steps")


@pytest.mark.parametrize("on_usage_chunk", [True, False])
def test_vllm_stream_either_placement(on_usage_chunk: bool) -> None:
    r = record(parse_stream_events("vllm", p.vllm_stream(on_usage_chunk)))
    assert (r.drafted, r.accepted, r.steps) == (120, 84, 40)


# --- SGLang ----------------------------------------------------------------------------------


def test_sglang_openai_usage() -> None:
    r = record(parse_response("sglang", p.sglang_openai()))
    assert (r.kind, r.drafted, r.accepted, r.rejected) == ("draft", 150, 90, 60)
    assert r.reported == {"accepted", "rejected"} and "drafted" in r.derived


def test_sglang_openai_zeros_ran_no_draft() -> None:
    assert parse_response("sglang", p.sglang_openai(0, 0)) == NotReported("sglang", "no_draft")


def test_sglang_generate_meta_info() -> None:
    r = record(parse_response("sglang", p.sglang_generate()))
    assert (r.drafted, r.accepted, r.steps) == (1600, 800, 200)
    assert r.acceptance_rate == 0.5 and r.mean_accept_len == 5.0
    assert r.per_position == (190, 180, 160, 130, 90, 40, 10)


def test_sglang_generate_older_names() -> None:
    r = record(parse_response("sglang", p.sglang_generate_old()))
    assert (r.drafted, r.accepted, r.steps) == (400, 250, 100)
    assert r.mean_accept_len == pytest.approx(3.5)


def test_sglang_accepted_from_completion_tokens_when_only_rounds_and_total() -> None:
    body = p.sglang_generate_old()
    del body["meta_info"]["spec_accept_token_num"]
    r = record(parse_response("sglang", body))
    assert r.accepted == 350 - 100 and "accepted" in r.derived


def test_sglang_rounds_without_draft_count_is_incomplete() -> None:
    body = {"text": "x", "meta_info": {"spec_verify_ct": 100, "completion_tokens": 350}}
    assert parse_response("sglang", body) == Malformed(
        "sglang", "incomplete", "spec_num_proposed_drafts"
    )


def test_sglang_meta_without_spec_fields_ran_no_draft() -> None:
    body = {"text": "x", "meta_info": {"id": "1", "completion_tokens": 3}}
    assert parse_response("sglang", body) == NotReported("sglang", "no_draft")


def test_sglang_stream_usage_chunk() -> None:
    r = record(parse_stream_events("sglang", p.sglang_stream()))
    assert (r.drafted, r.accepted) == (150, 90)


# --- vllm-mlx --------------------------------------------------------------------------------


def test_vllm_mlx_generation_metadata() -> None:
    r = record(parse_response("vllm_mlx", p.vllm_mlx_chat()))
    assert (r.kind, r.drafted, r.accepted, r.rejected) == ("mtp", 80, 52, 28)


def test_vllm_mlx_null_metadata_ran_no_draft_and_missing_is_absent() -> None:
    assert parse_response("vllm_mlx", p.vllm_mlx_chat(None)) == NotReported("vllm_mlx", "no_draft")
    body = p.vllm_mlx_chat()
    del body["generation_metadata"]
    assert parse_response("vllm_mlx", body) == NotReported("vllm_mlx", "absent")


def test_vllm_mlx_half_a_pair_is_incomplete() -> None:
    result = parse_response("vllm_mlx", p.vllm_mlx_chat({"mtp_drafts": 4}))
    assert result == Malformed("vllm_mlx", "incomplete", "mtp_accepted")


# --- OpenAI and generic OpenAI-compatible servers --------------------------------------------


def test_openai_predicted_outputs_are_not_drafts() -> None:
    r = record(parse_response("openai", p.openai_predicted()))
    assert (r.kind, r.drafted, r.accepted, r.rejected) == ("predicted_output", 28, 18, 10)


def test_openai_without_prediction_ran_no_draft() -> None:
    assert parse_response("openai", p.openai_predicted(0, 0)) == NotReported("openai", "no_draft")


def test_generic_openai_recognises_backend_fields() -> None:
    assert record(parse_response("openai", p.llamacpp_chat())).source == "llamacpp"
    assert record(parse_response("openai", p.vllm_chat())).source == "vllm"
    assert record(parse_response("openai", p.lmstudio_v1())).source == "lmstudio"
    assert record(parse_response("openai", p.vllm_mlx_chat())).kind == "mtp"
    # speclane's usage also carries prediction counts: its own block must win.
    assert record(parse_response("openai", p.speclane_chat(prediction=1))).source == "speclane"


def test_generic_openai_with_plain_usage_is_absent() -> None:
    assert parse_response("openai", p.mlx_lm_chat()) == NotReported("openai", "absent")


# --- speclane's worker -------------------------------------------------------------------------


def test_speclane_lane_that_chose_plain_decoding_declined() -> None:
    """The lane's drafter ran under ``auto`` and no draft paid at any step: not ``no_draft``."""
    body = p.speclane_chat()
    body["usage"]["speclane_spec"] = {
        "drafted": 0,
        "accepted": 0,
        "rejected": 0,
        "steps": 0,
        "num_draft_tokens": 8,
        "source": "auto",
        "plain_steps": 5,
        "sources": {},
    }
    assert parse_response("speclane", body) == NotReported("speclane", "declined")


def test_speclane_drafts_broken_down_by_source() -> None:
    body = p.speclane_chat(drafted=13, accepted=8, steps=3)
    spec = body["usage"]["speclane_spec"]
    spec["source"] = "auto"
    spec["sources"] = {
        "prompt_lookup": {"drafted": 10, "accepted": 8, "steps": 2},
        "suffix": {"drafted": 3, "accepted": 0, "steps": 1},
    }
    r = parse_response("speclane", body)
    assert isinstance(r, SpecRecord)
    assert (r.draft_source, r.drafted, r.accepted) == ("auto", 13, 8)
    assert r.by_source == (("prompt_lookup", 10, 8), ("suffix", 3, 0))
    # a source keeping more than it drafted contradicts itself
    spec["sources"]["suffix"]["accepted"] = 4
    assert parse_response("speclane", body) == Malformed(
        "speclane", "inconsistent", "sources.suffix"
    )


def test_speclane_worker() -> None:
    r = record(parse_response("speclane", p.speclane_chat(drafted=90, accepted=60, steps=30)))
    assert (r.drafted, r.accepted, r.rejected, r.steps) == (90, 60, 30, 30)
    assert r.mean_accept_len == 3.0
    assert r.reported == {"drafted", "accepted", "rejected", "steps"}


def test_speclane_batching_lane_ran_no_draft() -> None:
    assert parse_response("speclane", p.speclane_batching()) == NotReported("speclane", "no_draft")


def test_speclane_usage_without_its_block_breaks_the_contract() -> None:
    body = p.speclane_chat()
    del body["usage"]["speclane_spec"]
    assert parse_response("speclane", body) == Malformed("speclane", "incomplete", "speclane_spec")


def test_speclane_rejected_contradicting_the_others_is_inconsistent() -> None:
    body = p.speclane_chat()
    body["usage"]["speclane_spec"]["rejected"] = 1
    assert parse_response("speclane", body) == Malformed("speclane", "inconsistent")


@pytest.mark.parametrize("include_usage", [True, False])
def test_speclane_stream_counts_once(include_usage: bool) -> None:
    events = p.speclane_stream(include_usage)
    r = record(parse_stream_events("speclane", events))
    assert (r.drafted, r.accepted) == (90, 60)
    assert output_tokens(events[-1]) == 90  # the decode speed's count, from either place


# --- backends that report nothing ---------------------------------------------------------------


@pytest.mark.parametrize("kind", ["mlx_lm", "ollama"])
def test_silent_backends_are_labelled_not_zero(kind: str) -> None:
    body = p.mlx_lm_chat() if kind == "mlx_lm" else p.ollama_chat()
    assert parse_response(kind, body) == NotReported(kind, "not_supported")
    assert parse_stream_events(kind, [body]) == NotReported(kind, "not_supported")


# --- the stream reader's fallbacks ----------------------------------------------------------------


def test_stream_without_statistics_is_absent() -> None:
    events = p.vllm_stream(True)
    for e in events:
        e.pop("metrics", None)
    assert parse_stream_events("vllm", events) == NotReported("vllm", "absent")
    assert parse_stream_events("vllm", []) == NotReported("vllm", "absent")


def test_stream_prefers_malformed_over_absent_so_it_is_counted() -> None:
    events = p.llamacpp_stream(include_usage=False)
    events[-1]["timings"]["draft_n"] = "lots"
    assert parse_stream_events("llamacpp", events) == Malformed("llamacpp", "bad_type", "draft_n")


def test_stream_no_draft_beats_absent() -> None:
    events = p.lmstudio_stream()
    events[-1]["stats"] = {}
    assert parse_stream_events("lmstudio", events) == NotReported("lmstudio", "no_draft")


def test_stream_skips_events_that_are_not_objects() -> None:
    events = [*p.llamacpp_stream(include_usage=False), "[DONE]", None]
    assert record(parse_stream_events("llamacpp", events)).drafted == 347


def test_non_object_body_and_unknown_kind() -> None:
    assert parse_response("vllm", ["not", "a", "dict"]) == Malformed("vllm", "not_object")
    assert parse_response("tgi", {}) == NotReported("tgi", "not_supported")


def test_output_tokens_wherever_the_backend_puts_them() -> None:
    assert output_tokens(p.vllm_chat()) == 124
    assert output_tokens(p.llamacpp_completion()) == 200
    assert output_tokens(p.sglang_generate()) == 1024
    assert output_tokens({"eval_count": 7}) == 7
    assert output_tokens({"usage": {"completion_tokens": "x"}}) is None
    assert output_tokens("nope") is None


@pytest.mark.parametrize(
    ("source", "expected"),
    [
        ("prompt_lookup", "prompt_lookup"),
        ("prediction", "prediction"),
        ("draft_model", "draft_model"),
        ("suffix", "suffix"),
        ("forced", "forced"),
        (None, None),
        ("<script>", None),
        (7, None),
    ],
)
def test_speclane_draft_source_is_read_from_a_closed_vocabulary(
    source: object, expected: str | None
) -> None:
    body = p.speclane_chat(drafted=9, accepted=6, steps=3)
    body["usage"]["speclane_spec"]["source"] = source
    assert record(parse_response("speclane", body)).draft_source == expected
