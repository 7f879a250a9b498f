"""The backend pool: what it says about the backends it holds."""

from __future__ import annotations

from router.backends.base import Backend
from router.backends.cooldown import Cooldown
from router.backends.pool import BackendPool


def backend(name: str, lane: str | None = None) -> Backend:
    kind = "openai" if lane is None else "speclane"
    return Backend(
        name, kind, "http://127.0.0.1:1/v1", Cooldown(allowed_fails=3, seconds=5), lane=lane
    )  # type: ignore[arg-type]


def test_has_lanes_only_once_one_of_speclanes_lanes_is_added() -> None:
    pool = BackendPool([backend("ext")])
    assert not pool.has_lanes  # external backends only: no prefix is ever held by a lane
    pool.add(backend("batching", "batching"))
    assert pool.has_lanes
    pool.add(backend("ext2"))
    assert pool.has_lanes
