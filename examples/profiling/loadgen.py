"""Load generator for profile_streams.py: ``loadgen.py URL STREAMS CONCURRENCY TOKENS``.

A separate process, so that the router's profile holds the router only; reuses the
closed loop of ``examples/count_instructions.py``.
"""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # examples/
from count_instructions import relay_streams

if __name__ == "__main__":
    url, streams, concurrency, tokens = sys.argv[1], *map(int, sys.argv[2:5])
    asyncio.run(relay_streams(url, streams, concurrency, tokens))
