import pytest

from router.lanes.status import (
    TRANSITIONS,
    InvalidTransition,
    LaneState,
    LaneStatus,
    RestartBudget,
    backoff_delay,
    check_transition,
)

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
        [0.5, 1.0, 2.0, 4.0], rel=1e-5
    )


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
    ready = LaneStatus(
        lane="batching",
        state=LaneState.READY,
        base_url="http://127.0.0.1:1/v1",
        pid=42,
        health={"capacity": 8},
        restarts=1,
        last_error="boom",
    )
    assert ready.ready
    assert ready.to_dict() == {
        "lane": "batching",
        "state": "ready",
        "base_url": "http://127.0.0.1:1/v1",
        "pid": 42,
        "health": {"capacity": 8},
        "restarts": 1,
        "last_error": "boom",
    }


# --- state transitions -------------------------------------------------------------------


def test_every_state_has_a_row_and_no_state_returns_to_itself_by_table() -> None:
    assert set(TRANSITIONS) == set(LaneState)
    for old, allowed in TRANSITIONS.items():
        assert old not in allowed


@pytest.mark.parametrize("old", list(LaneState))
@pytest.mark.parametrize("new", list(LaneState))
def test_a_change_outside_the_table_raises(old: LaneState, new: LaneState) -> None:
    if new is old or new in TRANSITIONS[old]:
        check_transition("speculative", old, new)
    else:
        with pytest.raises(InvalidTransition, match=f"{old.value} -> {new.value}"):
            check_transition("speculative", old, new)


def test_a_stopped_lane_cannot_be_ready_without_starting() -> None:
    with pytest.raises(InvalidTransition):
        check_transition("batching", LaneState.STOPPED, LaneState.READY)
    with pytest.raises(InvalidTransition):
        check_transition("batching", LaneState.DOWN, LaneState.READY)


def test_a_lanes_health_is_its_own_block_of_a_shared_workers_health() -> None:
    from router.lanes.status import lane_health

    one = {"status": "ok", "mode": "batching", "queued": 1}
    assert lane_health(one, "batching") is one
    shared = {
        "status": "ok",
        "mode": "shared",
        "lanes": {"speculative": {"mode": "speculative"}, "batching": one},
    }
    assert lane_health(shared, "batching") is one
    assert lane_health(shared, "speculative") == {"mode": "speculative"}
    assert lane_health({"mode": "shared", "lanes": {}}, "batching") is None
    assert lane_health(None, "batching") is None


def test_stall_watch_counts_only_busy_time_without_progress() -> None:
    from router.lanes.status import StallWatch

    watch = StallWatch()
    idle = {"active": 0, "queued": 0, "progress_tokens": 100}
    busy = {"active": 1, "queued": 0, "progress_tokens": 100}
    assert watch.observe([idle], 0.0) == 0.0
    assert watch.observe([busy], 290.0) == 0.0  # work just arrived: the clock starts now
    assert watch.observe([busy], 300.0) == 10.0
    assert watch.observe([{**busy, "progress_tokens": 101}], 301.0) == 0.0  # it moved
    assert watch.observe([{**busy, "progress_tokens": 101}], 320.0) == 19.0
    assert watch.observe([idle], 330.0) == 0.0
    # a shared worker: the lanes' progress together (one lane waits while the other runs)
    lanes = [{"active": 0, "queued": 1, "progress_tokens": 5}, {**busy, "progress_tokens": 9}]
    assert watch.observe(lanes, 400.0) == 0.0
    moved = [lanes[0], {**busy, "progress_tokens": 10}]
    assert watch.observe(moved, 500.0) == 0.0
    # a worker that does not report progress is never judged
    assert watch.observe([{"active": 1, "queued": 0}], 900.0) == 0.0
