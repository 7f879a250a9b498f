"""Which models to unload for a load, and which idle ones expired (router.lanes.residency)."""

from __future__ import annotations

import pytest

from router.lanes.residency import Idle, Resident, check_interval, expired, make_room

GB = 1 << 30


def test_room_to_spare_evicts_nothing() -> None:
    plan = make_room(2 * GB, 10 * GB, [Resident("a", 3 * GB, 1.0)])
    assert (plan.fits, plan.evict, plan.never_fits) == (True, (), False)


def test_the_least_recently_used_idle_model_goes_first_and_only_as_many_as_needed() -> None:
    residents = [
        Resident("new", 3 * GB, last_used=30.0),
        Resident("old", 3 * GB, last_used=10.0),
        Resident("mid", 3 * GB, last_used=20.0),
    ]
    plan = make_room(4 * GB, 10 * GB, residents)
    assert (plan.fits, plan.evict) == (True, ("old",))
    plan = make_room(7 * GB, 10 * GB, residents)
    assert (plan.fits, plan.evict) == (True, ("old", "mid"))


@pytest.mark.parametrize(
    "busy",
    [
        Resident("a", 6 * GB, 1.0, in_flight=1),
        Resident("a", 6 * GB, 1.0, pinned=True),
        Resident("a", 6 * GB, 1.0, loading=True),
    ],
    ids=["in-flight", "pinned", "loading"],
)
def test_a_model_in_flight_pinned_or_loading_is_never_evicted(busy: Resident) -> None:
    plan = make_room(6 * GB, 10 * GB, [busy])
    assert (plan.fits, plan.evict, plan.never_fits, plan.holders) == (False, (), False, ("a",))


def test_the_busy_model_is_skipped_and_an_idle_older_one_goes() -> None:
    residents = [
        Resident("streaming", 4 * GB, last_used=1.0, in_flight=2),
        Resident("idle", 4 * GB, last_used=5.0),
    ]
    plan = make_room(5 * GB, 10 * GB, residents)
    assert (plan.fits, plan.evict) == (True, ("idle",))


def test_nothing_is_unloaded_when_unloading_all_evictable_would_not_be_enough() -> None:
    residents = [Resident("busy", 6 * GB, 1.0, in_flight=1), Resident("idle", 2 * GB, 2.0)]
    plan = make_room(5 * GB, 10 * GB, residents)
    assert (plan.fits, plan.evict, plan.holders) == (False, (), ("busy", "idle"))
    assert (plan.used_bytes, plan.need_bytes, plan.limit_bytes) == (8 * GB, 5 * GB, 10 * GB)


def test_a_model_bigger_than_the_limit_never_fits() -> None:
    plan = make_room(11 * GB, 10 * GB, [Resident("a", 1 * GB, 1.0)])
    assert (plan.fits, plan.never_fits, plan.evict) == (False, True, ())


def test_exactly_the_limit_fits() -> None:
    assert make_room(4 * GB, 10 * GB, [Resident("a", 6 * GB, 1.0)]).fits


def test_ttl_expiry() -> None:
    models = [
        Idle("expired", last_used=0.0, ttl=10),
        Idle("fresh", last_used=95.0, ttl=10),
        Idle("never", last_used=0.0, ttl=0),
        Idle("pinned", last_used=0.0, ttl=10, pinned=True),
        Idle("streaming", last_used=0.0, ttl=10, in_flight=1),
        Idle("older", last_used=-5.0, ttl=10),
    ]
    assert expired(100.0, models) == ["older", "expired"]


def test_an_explicit_deadline_wins_over_the_ttl_but_not_over_pinned_or_in_flight() -> None:
    models = [
        Idle("keep0", last_used=99.0, ttl=300, deadline=99.0),
        Idle("keep_long", last_used=0.0, ttl=10, deadline=500.0),
        Idle("forever", last_used=0.0, ttl=10, deadline=float("inf")),
        Idle("pinned", last_used=0.0, ttl=10, pinned=True, deadline=0.0),
        Idle("busy", last_used=0.0, ttl=10, in_flight=1, deadline=0.0),
    ]
    assert expired(100.0, models) == ["keep0"]


def test_check_interval_follows_the_shortest_ttl() -> None:
    assert check_interval([]) == 5.0
    assert check_interval([0, 0]) == 5.0
    assert check_interval([300, 0]) == 5.0
    assert check_interval([2.0, 300]) == 0.5
    assert check_interval([0.01]) == 0.1
