"""router.metrics: remembered label children still count each series on its own."""

from __future__ import annotations

from router.metrics import Metrics
from tests.conftest import metric_value


def test_remembered_children_keep_series_apart() -> None:
    m = Metrics()
    first = m.requests.labels("chat", "a", "200", "openai")
    assert m.requests.labels("chat", "a", "200", "openai") is first
    first.inc()
    m.requests.labels("chat", "a", "200", "openai").inc()
    m.requests.labels("chat", "b", "200", "openai").inc()
    m.requests.labels(endpoint="chat", backend="a", status="500",
                      api="openai").inc()  # keywords still work
    text = m.render().decode()
    total = "speclane_requests_total"
    assert metric_value(text, total, endpoint="chat", backend="a", status="200") == 2
    assert metric_value(text, total, endpoint="chat", backend="b", status="200") == 1
    assert metric_value(text, total, endpoint="chat", backend="a", status="500") == 1
