"""router.routing.load: the requests a new one waits for on a lane."""

from __future__ import annotations

from router.routing.load import waiting


def test_a_new_request_waits_for_what_the_lane_cannot_decode_beside_it() -> None:
    assert [waiting(load, 1) for load in (0, 1, 2)] == [0, 1, 2]  # the speculative lane
    assert [waiting(load, 4) for load in (0, 3, 4, 6)] == [0, 0, 1, 3]
