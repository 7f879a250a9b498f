import pytest

from router.lanes.status import (
    READY_PREFIX,
    LaneState,
    LaneStatus,
    RestartBudget,
    backoff_delay,
    parse_ready_line,
)

# --- ready line ----------------------------------------------------------------------------


def test_ready_line_gives_the_port():
    line = READY_PREFIX + '{"port": 40123, "mode": "speculative", "model": "m"}'
    assert parse_ready_line(line) == 40123


@pytest.mark.parametrize(
    "line",
    [
        "",
        "SPECLANE_WORKER_READY",
        "some log line with port 40123",
        "speclane_worker_ready {\"port\": 1}",
        READY_PREFIX + "not json",
        READY_PREFIX + "[40123]",
        READY_PREFIX + '{"mode": "batching"}',
        READY_PREFIX + '{"port": "40123"}',
        READY_PREFIX + '{"port": true}',
        READY_PREFIX + '{"port": 0}',
        READY_PREFIX + '{"port": 70000}',
    ],
)
def test_anything_else_is_not_a_ready_line(line):
    assert parse_ready_line(line) is None


# --- restart budget ------------------------------------------------------------------------


def test_budget_allows_max_restarts_within_the_window():
    budget = RestartBudget(max_restarts=2, window=10.0)
    assert not budget.exhausted(0.0)
    budget.record(0.0)
    assert not budget.exhausted(1.0)
    budget.record(1.0)
    assert budget.exhausted(2.0)
    assert budget.recent(2.0) == 2


def test_budget_forgets_restarts_older_than_the_window():
    budget = RestartBudget(max_restarts=2, window=10.0)
    budget.record(0.0)
    budget.record(5.0)
    assert budget.exhausted(9.9)
    assert budget.recent(10.0) == 1  # the restart at t=0 left the window
    assert not budget.exhausted(10.0)
    assert budget.recent(15.0) == 0


def test_zero_restarts_allowed_gives_up_at_the_first_loss():
    assert RestartBudget(max_restarts=0, window=60.0).exhausted(0.0)


@pytest.mark.parametrize(("max_restarts", "window"), [(-1, 10.0), (1, 0.0), (1, -5.0)])
def test_budget_rejects_nonsense(max_restarts, window):
    with pytest.raises(ValueError):
        RestartBudget(max_restarts, window)


# --- backoff -------------------------------------------------------------------------------


def test_backoff_doubles_with_recent_restarts():
    assert [backoff_delay(n, 0.5, 100.0, rand=0.999999) for n in range(4)] == pytest.approx(
        [0.5, 1.0, 2.0, 4.0], rel=1e-5)


def test_backoff_jitter_spans_half_to_full_base():
    assert backoff_delay(2, 0.5, 100.0, rand=0.0) == pytest.approx(1.0)
    assert backoff_delay(2, 0.5, 100.0, rand=0.5) == pytest.approx(1.5)


def test_backoff_is_capped_and_survives_huge_counts():
    assert backoff_delay(10, 0.5, 30.0, rand=0.999999) == pytest.approx(30.0, rel=1e-5)
    assert backoff_delay(10_000, 0.5, 30.0, rand=0.0) == pytest.approx(15.0)


# --- status --------------------------------------------------------------------------------


def test_status_defaults_and_dict():
    status = LaneStatus(lane="batching")
    assert status.state is LaneState.STOPPED and not status.ready
    ready = LaneStatus(lane="batching", state=LaneState.READY, base_url="http://127.0.0.1:1/v1",
                       pid=42, health={"capacity": 8}, restarts=1, last_error="boom")
    assert ready.ready
    assert ready.to_dict() == {
        "lane": "batching", "state": "ready", "base_url": "http://127.0.0.1:1/v1", "pid": 42,
        "health": {"capacity": 8}, "restarts": 1, "last_error": "boom",
    }
