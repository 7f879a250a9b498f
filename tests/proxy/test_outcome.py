"""router.proxy.outcome: what a relayed answer reported."""

from __future__ import annotations

from router.kernel.worker_contract import STREAM_USAGE_FIELD
from router.proxy.outcome import Outcome

USAGE = {"prompt_tokens": 40, "prompt_tokens_details": {"cached_tokens": 30}}


def test_a_lane_stream_without_usage_asked_still_reports_its_usage() -> None:
    """A client that asked for no usage gets none, but the lane's finish chunk carries it
    under its own field: the prefix watch and the figures still read the cached tokens."""
    outcome = Outcome(endpoint="chat", arrival=0.0, stream=True)
    outcome.tail_events = [{"choices": []}, {"choices": [], STREAM_USAGE_FIELD: USAGE}]
    assert outcome.reported_usage() == USAGE


def test_the_newest_usage_wins_and_a_body_reports_its_own() -> None:
    outcome = Outcome(endpoint="chat", arrival=0.0, stream=True)
    outcome.tail_events = [{STREAM_USAGE_FIELD: {"prompt_tokens": 1}}, {"usage": USAGE}]
    assert outcome.reported_usage() == USAGE
    whole = Outcome(endpoint="chat", arrival=0.0, body_json={"usage": USAGE})
    assert whole.reported_usage() == USAGE
    assert Outcome(endpoint="chat", arrival=0.0).reported_usage() is None
