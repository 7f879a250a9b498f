"""Parsers never raise, never hit their own safety net, and only emit coherent records."""

from __future__ import annotations

import copy
import math
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from router.speculation.parsers import PARSERS, output_tokens, parse_response, parse_stream_events
from router.speculation.record import (
    MALFORMED_REASONS,
    NOT_REPORTED_REASONS,
    Malformed,
    NotReported,
    SpecRecord,
)
from tests.fuzzing import examples
from tests.speculation import payloads as p

# Every field name a parser looks at, so random objects actually reach the parsing paths.
FIELD_NAMES = [
    "stats",
    "usage",
    "timings",
    "metrics",
    "speculative_decoding",
    "meta_info",
    "generation_metadata",
    "completion_tokens_details",
    "speclane_spec",
    "total_draft_tokens_count",
    "accepted_draft_tokens_count",
    "rejected_draft_tokens_count",
    "ignored_draft_tokens_count",
    "draft_n",
    "draft_n_accepted",
    "num_draft_tokens",
    "num_accepted_draft_tokens",
    "num_spec_steps",
    "draft_acceptance_rate",
    "mean_acceptance_length",
    "acceptance_histogram",
    "spec_verify_ct",
    "spec_num_correct_drafts",
    "spec_num_proposed_drafts",
    "spec_accept_rate",
    "spec_accept_length",
    "spec_accept_token_num",
    "spec_draft_token_num",
    "spec_correct_drafts_histogram",
    "completion_tokens",
    "mtp_drafts",
    "mtp_accepted",
    "accepted_prediction_tokens",
    "rejected_prediction_tokens",
    "drafted",
    "accepted",
    "rejected",
    "steps",
    "num_draft_tokens",
    "choices",
]

scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-5, max_value=500),
    st.integers(),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=5),
)
keys = st.one_of(st.sampled_from(FIELD_NAMES), st.text(max_size=4))
json_values = st.recursive(
    scalars,
    lambda inner: st.one_of(
        st.lists(inner, max_size=4),
        st.dictionaries(keys, inner, max_size=6),
    ),
    max_leaves=25,
)
json_objects = st.dictionaries(keys, json_values, max_size=8)
kinds = st.sampled_from([*PARSERS, "unknown"])


def _paths(value: Any, prefix: tuple = ()) -> list[tuple]:
    found = [prefix]
    if isinstance(value, dict):
        for k, v in value.items():
            found += _paths(v, (*prefix, k))
    elif isinstance(value, list):
        for i, v in enumerate(value):
            found += _paths(v, (*prefix, i))
    return found


def mutated_bodies(kind: str) -> st.SearchStrategy[dict]:
    """A realistic body of ``kind`` with one to three values replaced by anything."""

    @st.composite
    def build(draw: st.DrawFn) -> dict:
        body = copy.deepcopy(draw(st.sampled_from(p.ALL_BODIES[kind])))
        for _ in range(draw(st.integers(1, 3))):
            path = draw(st.sampled_from(_paths(body)[1:] or [()]))
            if not path:
                break
            target = body
            for step in path[:-1]:
                target = target[step]
            target[path[-1]] = draw(json_values)
        return body

    return build()


any_mutated_body = st.sampled_from(sorted(p.ALL_BODIES)).flatmap(mutated_bodies)


def check(result: object) -> None:
    assert isinstance(result, SpecRecord | NotReported | Malformed)
    if isinstance(result, Malformed):
        assert result.reason in MALFORMED_REASONS and result.reason != "parser_error"
        return
    if isinstance(result, NotReported):
        assert result.reason in NOT_REPORTED_REASONS
        return
    r = result
    assert r.drafted > 0  # nothing drafted is reported as no_draft, never as a record
    assert min(r.accepted, r.rejected, r.ignored) >= 0
    assert r.accepted + r.rejected + r.ignored == r.drafted
    assert r.acceptance_rate is not None and 0.0 <= r.acceptance_rate <= 1.0
    assert r.steps is None or r.steps > 0
    if r.mean_accept_len is not None:
        assert math.isfinite(r.mean_accept_len) and r.mean_accept_len >= 0
    assert all(isinstance(n, int) and n >= 0 for n in r.per_position)
    assert r.reported <= {
        "drafted",
        "accepted",
        "rejected",
        "ignored",
        "steps",
        "acceptance_rate",
        "mean_accept_len",
        "per_position",
    }


@settings(max_examples=examples(400), deadline=None)
@given(kind=kinds, body=st.one_of(json_objects, json_values))
def test_any_json_never_raises(kind: str, body: Any) -> None:
    check(parse_response(kind, body))
    output_tokens(body)


@pytest.mark.parametrize("kind", sorted(p.ALL_BODIES))
@settings(max_examples=examples(200), deadline=None)
@given(data=st.data())
def test_nearly_valid_bodies_never_raise(kind: str, data: st.DataObject) -> None:
    body = data.draw(mutated_bodies(kind))
    check(parse_response(kind, body))
    check(parse_response("openai", body))


@settings(max_examples=examples(200), deadline=None)
@given(kind=kinds, events=st.lists(st.one_of(any_mutated_body, json_values), max_size=5))
def test_streams_never_raise(kind: str, events: list) -> None:
    check(parse_stream_events(kind, events))


def every_event_parsed(kind: str, events: list) -> Any:
    """parse_stream_events without its skipping of events that carry no statistics fields:
    the result it must keep giving."""
    if kind not in PARSERS or kind in ("mlx_lm", "ollama"):
        return NotReported(kind, "not_supported")
    fallback: Any = NotReported(kind, "absent")
    for event in reversed(events):
        if not isinstance(event, dict):
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


@settings(max_examples=examples(400), deadline=None)
@given(kind=kinds, events=st.lists(st.one_of(any_mutated_body, json_objects), max_size=5))
def test_skipping_events_without_statistics_fields_changes_no_result(
    kind: str, events: list
) -> None:
    assert parse_stream_events(kind, events) == every_event_parsed(kind, events)


@pytest.mark.parametrize("kind", sorted(p.ALL_BODIES))
def test_every_real_body_is_read_in_a_stream(kind: str) -> None:
    # The skip must not hide any backend's real statistics (each body, alone or after a
    # content chunk).
    for body in p.ALL_BODIES[kind]:
        content = {"choices": [{"index": 0, "delta": {"content": "x"}}]}
        for events in ([body], [body, content], [content, body]):
            assert parse_stream_events(kind, events) == every_event_parsed(kind, events)
            assert parse_stream_events("openai", events) == every_event_parsed("openai", events)
