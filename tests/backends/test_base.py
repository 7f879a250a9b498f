"""router.backends.base: a backend's request bookkeeping."""

from __future__ import annotations

import pytest

from router.backends.base import Backend
from router.backends.cooldown import Cooldown


def test_rows_marks_give_a_requests_average_company() -> None:
    b = Backend("lane", "speclane", "http://127.0.0.1:1/v1", Cooldown(3, 1.0), lane="batching")
    b.rows_since = 100.0  # as if the clock started here
    start = b.rows_mark(100.0)
    b.inflight, b.rows_since = 1, 100.0  # one request from 100
    b.rows_area = start
    b._account(104.0)
    b.inflight += 1  # a second one joins at 104
    end = b.rows_mark(108.0)  # both until 108
    assert (end - start) / (108.0 - 100.0) == pytest.approx(1.5)


def test_started_and_ended_keep_the_area_growing_with_inflight() -> None:
    b = Backend("lane", "speclane", "http://127.0.0.1:1/v1", Cooldown(3, 1.0), lane="batching")
    solo, epoch = b.request_started()
    assert solo and b.inflight == 1
    first = b.rows_mark(b.rows_since + 2.0)
    assert first == pytest.approx(b.rows_area + 2.0)  # one request for two seconds
    assert b.request_ended(epoch)
    assert b.inflight == 0
    assert b.rows_mark(b.rows_since + 5.0) == pytest.approx(b.rows_area)  # idle: no growth
