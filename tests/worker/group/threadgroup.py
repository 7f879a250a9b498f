"""An in-process group for the protocol's fast tests: each rank a thread, ``all_sum`` a
barrier over a shared sum (the pairing of collectives in call order, as MLX's backends)."""

from __future__ import annotations

import threading
from collections.abc import Sequence


class ThreadGroup:
    def __init__(self, size: int, timeout: float = 10.0) -> None:
        self.size = size
        self._barrier = threading.Barrier(size, timeout=timeout)
        self._lock = threading.Lock()
        self._acc: list[int] | None = None

    def channel(self, rank: int) -> ThreadChannel:
        return ThreadChannel(self, rank)

    def all_sum(self, values: Sequence[int]) -> list[int]:
        with self._lock:
            if self._acc is None:
                self._acc = list(values)
            else:
                if len(self._acc) != len(values):
                    raise AssertionError("ranks paired collectives of different sizes")
                self._acc = [a + b for a, b in zip(self._acc, values, strict=True)]
        self._barrier.wait()
        assert self._acc is not None
        result = list(self._acc)
        if self._barrier.wait() == 0:
            self._acc = None
        self._barrier.wait()
        return result


class ThreadChannel:
    def __init__(self, group: ThreadGroup, rank: int) -> None:
        self._group = group
        self._rank = rank

    @property
    def rank(self) -> int:
        return self._rank

    @property
    def size(self) -> int:
        return self._group.size

    def all_sum(self, values: Sequence[int]) -> list[int]:
        return self._group.all_sum(values)
