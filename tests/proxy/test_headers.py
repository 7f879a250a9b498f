"""router.proxy.headers: the decision headers, built once, then the backend that answered."""

from __future__ import annotations

from router.config.names import DECISION_HEADER
from router.proxy.headers import decision_headers, served_headers
from tests.routing.test_classify import Case, run


def test_decision_headers_name_the_first_choice_and_the_reason() -> None:
    result = run(
        Case("x", "batching", "spec-lane-busy", preset="interactive", spec={"inflight": 1})
    )
    headers = decision_headers(result, overhead=0.0012, waited=0.5)
    assert headers == {
        "X-Speclane-Lane": "batching",
        "X-Speclane-Backend": "batching",
        "X-Speclane-Client": "c",
        DECISION_HEADER: "preset=interactive,spec-lane-busy->batching",
        "X-Speclane-Overhead-Ms": "1.200",
        "X-Speclane-Queue-Ms": "500.000",
    }
    served = result.decision.candidates[1]
    answered = served_headers(headers, served.backend, served.lane, 2)
    assert answered["X-Speclane-Lane"] == "speculative"
    assert answered["X-Speclane-Backend"] == "speculative"
    assert answered["X-Speclane-Attempts"] == "2"
    assert answered[DECISION_HEADER] == headers[DECISION_HEADER]
