"""``speclane bench [overhead | agent] ...``: dispatch to the benchmark asked for (the
scorecard when none is named)."""

from __future__ import annotations

import importlib

COMMANDS = {"agent": "router.bench.agent.cli", "overhead": "router.bench.overhead.cli"}


def main(argv: list[str]) -> int:
    if argv and argv[0] in COMMANDS:
        return int(importlib.import_module(COMMANDS[argv[0]]).main(argv[1:]))
    return int(importlib.import_module("router.bench.scorecard.cli").main(argv))
