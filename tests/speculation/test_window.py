"""Sliding windows."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from router.speculation.window import AcceptanceWindow, BaselineSpeeds, SpeedWindow


def test_window_pools_counts_over_the_most_recent_tokens() -> None:
    w = AcceptanceWindow(size=100)
    w.add(60, 60)
    w.add(60, 0)
    assert w.figures().acceptance == 0.5  # 120 >= 100 but dropping the first leaves 60 < 100
    w.add(60, 0)
    fig = w.figures()
    assert (fig.drafted, fig.accepted, fig.entries) == (120, 0, 2)
    assert fig.acceptance == 0.0


def test_rounds_unit_counts_verification_rounds_and_falls_back_to_tokens() -> None:
    w = AcceptanceWindow(size=10, unit="rounds")
    w.add(30, 20, steps=10)
    w.add(30, 0, steps=10)
    assert w.figures().units == 10 and w.figures().accepted == 0
    w.add(5, 5)  # no rounds reported: its 5 draft tokens count
    assert w.figures().units == 15


def test_empty_entries_are_ignored_and_clear_empties() -> None:
    w = AcceptanceWindow(size=10)
    w.add(0, 0)
    assert w.figures().entries == 0 and w.figures().acceptance is None
    w.add(5, 2)
    w.clear()
    assert w.figures().drafted == 0


counts = st.tuples(st.integers(0, 80), st.integers(0, 80))


@given(st.integers(1, 300), st.lists(counts, max_size=200))
def test_window_stays_bounded_and_consistent(size: int, adds: list[tuple[int, int]]) -> None:
    w = AcceptanceWindow(size=size)
    seen = 0
    for drafted, accepted in adds:
        w.add(drafted, accepted)
        seen += drafted
        fig = w.figures()
        assert fig.units >= min(seen, size)
        assert fig.entries <= size + 1
        assert 0 <= fig.accepted <= fig.drafted
        kept = w.entries()
        assert fig.drafted == sum(e.drafted for e in kept)
        # The window covers ``size`` units whenever it has seen that many, and no more than
        # it needs: without its oldest entry it would fall short.
        if len(kept) > 1:
            assert fig.units - kept[0].drafted < size


def test_speed_window_median_needs_a_minimum_sample() -> None:
    w = SpeedWindow(size=3)
    for v in (10.0, 50.0):
        w.add(v)
    assert w.median(min_samples=3) is None
    w.add(20.0)
    w.add(30.0)  # 10 falls out
    assert w.median(min_samples=3) == 30.0 and len(w) == 3


def test_baseline_falls_back_to_the_model_wide_window() -> None:
    b = BaselineSpeeds(size=8, max_slots=10)
    for v in (40.0, 42.0):
        b.add("m", "chat", v)
    b.add("m", "code", 44.0)
    assert b.median("m", "chat", 2) == (41.0, "workload")
    assert b.median("m", "code", 2) == (42.0, "model")
    assert b.median("other", "chat", 1) == (None, None)


def test_baseline_slots_are_bounded() -> None:
    b = BaselineSpeeds(size=4, max_slots=3)
    for i in range(10):
        b.add(f"m{i}", "w", 1.0)
    assert len(b._windows) <= 3


def test_baselines_are_kept_per_lane_and_never_mixed() -> None:
    """The batching lane's plain speed is no baseline for the speculative lane's drafts."""
    b = BaselineSpeeds(size=8, max_slots=10)
    for _ in range(3):
        b.add("m", "w", 9.0, lane="batching")
    assert b.median("m", "w", 3, lane="speculative") == (None, None)
    assert b.median("m", "w", 3, lane="batching") == (9.0, "workload")
    for _ in range(3):
        b.add("m", "other", 12.0, lane="speculative")
    assert b.median("m", "w", 3, lane="speculative") == (12.0, "model")
