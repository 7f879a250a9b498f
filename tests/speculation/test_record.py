"""Derivations of the normalized record."""

from __future__ import annotations

import pytest

from router.speculation.record import (
    Malformed,
    NotReported,
    Observation,
    SpecRecord,
    build_record,
    unavailable_reason,
)


def built(**fields: object) -> SpecRecord:
    result = build_record("test", "request", "draft", **fields)  # type: ignore[arg-type]
    assert isinstance(result, SpecRecord), result
    return result


def test_rejected_acceptance_and_mean_length_are_derived() -> None:
    r = built(drafted=90, accepted=60, steps=30)
    assert (r.rejected, r.ignored) == (30, 0)
    assert r.acceptance_rate == pytest.approx(60 / 90)
    assert r.mean_accept_len == pytest.approx(1 + 60 / 30)
    assert r.reported == {"drafted", "accepted", "steps"}
    assert r.derived == {"rejected", "ignored", "acceptance_rate", "mean_accept_len"}


def test_drafted_from_accepted_rejected_and_ignored() -> None:
    r = built(accepted=5, rejected=3, ignored=2)
    assert r.drafted == 10 and "drafted" in r.derived


def test_accepted_from_drafted_and_rejected() -> None:
    assert built(drafted=10, rejected=4).accepted == 6


def test_reported_rates_are_kept_and_computed_fields_are_marked_derived() -> None:
    r = built(
        drafted=100,
        accepted=50,
        acceptance_rate=0.5001,
        per_position=(30, 20),
        computed=["per_position"],
    )
    assert r.acceptance_rate == 0.5001
    assert "acceptance_rate" in r.reported and "per_position" in r.derived


def test_unusable_reported_rates_fall_back_to_derived() -> None:
    r = built(drafted=100, accepted=50, steps=10, acceptance_rate=1.5, mean_accept_len=-2.0)
    assert r.acceptance_rate == 0.5 and r.mean_accept_len == 6.0
    assert not {"acceptance_rate", "mean_accept_len"} & r.reported


@pytest.mark.parametrize(
    ("fields", "reason"),
    [
        ({"drafted": 10, "accepted": 11}, "inconsistent"),
        ({"drafted": 10, "accepted": 5, "rejected": 4}, "inconsistent"),
        ({"drafted": 10, "accepted": 5, "rejected": 4, "ignored": 2}, "inconsistent"),
        ({"drafted": 10, "rejected": 11}, "inconsistent"),
        ({"drafted": 10}, "incomplete"),
        ({"accepted": 10}, "incomplete"),
        ({"drafted": 10, "accepted": 5, "steps": 0}, "inconsistent"),
    ],
)
def test_contradictions_and_gaps(fields: dict, reason: str) -> None:
    result = build_record("test", "request", "draft", **fields)
    assert isinstance(result, Malformed) and result.reason == reason


def test_nothing_drafted_is_a_record_without_rate() -> None:
    r = built(drafted=0, accepted=0)
    assert r.acceptance_rate is None and r.mean_accept_len is None


def test_decode_speed_counts_tokens_after_the_first() -> None:
    assert Observation(output_tokens=101, decode_seconds=4.0).decode_tps() == 25.0
    assert Observation(output_tokens=10, decode_seconds=1.0).decode_tps(min_tokens=16) is None
    assert Observation(output_tokens=1, decode_seconds=1.0).decode_tps() is None
    assert Observation(output_tokens=50, decode_seconds=0.0).decode_tps() is None
    assert Observation(output_tokens=50, decode_seconds=float("nan")).decode_tps() is None


def test_unavailable_reason_labels() -> None:
    assert unavailable_reason(built(drafted=5, accepted=1)) is None
    assert unavailable_reason(NotReported("ollama", "not_supported")) == "not_supported"
    assert unavailable_reason(Malformed("vllm", "negative", "x")) == "malformed_negative"
