"""The batching lane's draft table and source choice (pure)."""

from __future__ import annotations

import pytest

from router.worker.drafting.draftlength import (
    BATCH_DRAFT_TABLE,
    FORCED_TABLE_FACTOR,
    PLAIN,
    BatchDraftSettings,
    BatchPlan,
    batch_draft_length,
    batch_plan,
    forced_draft_length,
    sequence_draft_length,
)
from router.worker.drafting.drafts import LookupConfig
from router.worker.drafting.forced import FORCED_MAX_DRAFT
from router.worker.request.protocol import GenerationRequest, Message


@pytest.mark.parametrize(
    ("size", "length"), [(1, 8), (2, 8), (3, 6), (4, 6), (5, 2), (8, 2), (9, 0), (32, 0)]
)
def test_the_draft_shrinks_as_the_batch_grows(size: int, length: int) -> None:
    assert batch_draft_length(size) == length


def test_the_table_is_monotonic_and_ends_in_no_drafting() -> None:
    lengths = [batch_draft_length(n) for n in range(1, 40)]
    assert lengths == sorted(lengths, reverse=True)
    assert batch_draft_length(BATCH_DRAFT_TABLE[-1][0] + 1) == 0


def test_a_sequence_drafts_no_more_than_its_source_or_its_room() -> None:
    assert sequence_draft_length(1, 16, 100) == 8  # the table
    assert sequence_draft_length(1, 3, 100) == 3  # the source's maximum
    assert sequence_draft_length(1, 16, 4) == 3  # the pending token takes one of 4 left
    assert sequence_draft_length(1, 16, 1) == 0
    assert sequence_draft_length(12, 16, 100) == 0


def request(**fields: object) -> GenerationRequest:
    return GenerationRequest(kind="chat", messages=(Message("user", "hi"),), **fields)  # type: ignore[arg-type]


SETTINGS = BatchDraftSettings(lookup=LookupConfig(max_draft=5))


@pytest.mark.parametrize(
    ("fields", "processors", "plan"),
    [
        ({}, False, PLAIN),  # the lane names no source of its own
        ({"prediction": "x"}, False, BatchPlan("prediction", 16)),
        ({"prediction": "x", "draft_source": "prompt_lookup"}, False, BatchPlan("prediction", 16)),
        ({"draft_source": "prompt_lookup"}, False, BatchPlan("prompt_lookup", 5)),
        ({"draft_source": "suffix", "num_draft_tokens": 4}, False, BatchPlan("suffix", 4)),
        ({"draft_source": "draft_model"}, False, PLAIN),  # no draft model on this lane
        ({"draft_source": "prompt_lookup", "num_draft_tokens": 0}, False, PLAIN),
        ({"prediction": "x"}, True, PLAIN),  # penalties or a bias
    ],
)
def test_the_plan(fields: dict[str, object], processors: bool, plan: BatchPlan) -> None:
    assert batch_plan(request(**fields), SETTINGS, processors) == plan


def test_a_lane_source_applies_to_requests_naming_none() -> None:
    settings = BatchDraftSettings(draft_source="suffix")
    assert batch_plan(request(), settings, False) == BatchPlan("suffix", 16)


@pytest.mark.parametrize(
    ("size", "length"), [(1, 16), (2, 16), (3, 12), (4, 12), (5, 4), (8, 4), (9, 0), (32, 0)]
)
def test_forced_runs_follow_the_table_at_its_factor_up_to_the_speculative_lanes_cap(
    size: int, length: int
) -> None:
    assert forced_draft_length(size, FORCED_MAX_DRAFT, 100) == length
    assert length == min(FORCED_MAX_DRAFT, FORCED_TABLE_FACTOR * batch_draft_length(size))


def test_a_forced_run_is_no_longer_than_its_plan_or_its_room() -> None:
    assert forced_draft_length(1, 5, 100) == 5  # the request's num_draft_tokens
    assert forced_draft_length(1, 16, 4) == 3  # the pending token takes one of 4 left
    assert forced_draft_length(1, 16, 1) == 0
    assert forced_draft_length(1, 0, 100) == 0  # not constrained


@pytest.mark.parametrize(
    ("fields", "processors", "plan"),
    [
        ({}, False, BatchPlan(None, 0, FORCED_MAX_DRAFT)),  # forced tokens only
        ({"draft_source": "prompt_lookup"}, False, BatchPlan("prompt_lookup", 5, 16)),
        ({"prediction": "x", "num_draft_tokens": 3}, False, BatchPlan("prediction", 3, 3)),
        ({"draft_source": "draft_model"}, False, BatchPlan(None, 0, 16)),
        ({"draft_source": "suffix", "num_draft_tokens": 0}, False, PLAIN),  # auto-disable's off
        ({"draft_source": "suffix"}, True, PLAIN),  # a bias or penalties besides the grammar
    ],
)
def test_a_constrained_request_drafts_forced_tokens(
    fields: dict[str, object], processors: bool, plan: BatchPlan
) -> None:
    chosen = batch_plan(request(**fields), SETTINGS, processors, constrained=True)
    assert chosen == plan
    assert chosen.drafts == (plan != PLAIN)
