"""How many cases the fuzzers and property tests run: all of them in CI, a fifth in the
quick loop.

``pytest`` alone (the fast tier, for every change) runs a fifth of each fuzzer's and property
test's cases; ``SPECLANE_FUZZ=full`` runs them all, and ``./docker-less-run.sh test`` (what CI
runs) sets it. Hypothesis is derandomised here, so a run's cases are the same every time.
"""

from __future__ import annotations

import os

FULL = os.environ.get("SPECLANE_FUZZ", "") == "full"
QUICK_SHARE = 0.2  # of each count, in the quick loop


def examples(full: int) -> int:
    """``full`` cases under ``SPECLANE_FUZZ=full``, else a fifth of them (at least one)."""
    return full if FULL else max(1, round(full * QUICK_SHARE))
