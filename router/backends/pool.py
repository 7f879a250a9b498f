"""The set of backends the router knows, by name."""

from __future__ import annotations

import time
from collections.abc import Iterator

from router.backends.base import Backend
from router.routing.types import BackendView


class BackendPool:
    def __init__(self, backends: list[Backend] | None = None) -> None:
        self._by_name: dict[str, Backend] = {}
        # speclane's own lanes are among the backends: only then can a request's prefix be
        # held by a lane (cache affinity), so only then are its fingerprints worth computing.
        self.has_lanes = False
        for b in backends or []:
            self.add(b)

    def add(self, backend: Backend) -> None:
        if backend.name in self._by_name:
            raise ValueError(f"backend '{backend.name}' is already registered")
        self._by_name[backend.name] = backend
        self.has_lanes = self.has_lanes or backend.lane is not None

    def remove(self, name: str) -> Backend | None:
        """Take a backend out (a model's lanes when it unloads): no new request is routed
        to it; one already sent keeps its ``Backend`` object to the end."""
        backend = self._by_name.pop(name, None)
        self.has_lanes = any(b.lane is not None for b in self._by_name.values())
        return backend

    def get(self, name: str) -> Backend | None:
        return self._by_name.get(name)

    def __getitem__(self, name: str) -> Backend:
        return self._by_name[name]

    def __iter__(self) -> Iterator[Backend]:
        return iter(self._by_name.values())

    def __len__(self) -> int:
        return len(self._by_name)

    def snapshot(self) -> tuple[BackendView, ...]:
        now = time.monotonic()
        return tuple(b.view(now) for b in self._by_name.values())

    def any_ready(self) -> bool:
        return any(b.ready for b in self._by_name.values())

    def context_lengths(self) -> dict[str, int]:
        """model -> the context its lanes report (the smallest, when they differ: a prompt
        must fit whichever lane serves it); models no lane reports for are left out."""
        found: dict[str, int] = {}
        for b in self._by_name.values():
            if b.lane is not None and (n := b.context_length) is not None:
                for m in b.models:
                    found[m] = min(n, found.get(m, n))
        return found

    def models(self) -> list[tuple[str, str]]:
        """(model id, owning backend) over ready backends, each model once, sorted."""
        seen: dict[str, str] = {}
        for b in self._by_name.values():
            if b.ready:
                for m in sorted(b.models):
                    seen.setdefault(m, b.name)
        return sorted(seen.items())
