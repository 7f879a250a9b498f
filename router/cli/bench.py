"""``speclane bench [overhead | agent | lanes | cold] ...``: dispatch to the benchmark asked
for (each parses its own flags)."""

from __future__ import annotations


def main(argv: list[str]) -> int:
    if argv and argv[0] == "agent":
        from router.bench.agent.cli import main as agent

        return agent(argv[1:])
    if argv and argv[0] == "lanes":
        from router.bench.lanes.cli import main as lanes

        return lanes(argv[1:])
    if argv and argv[0] == "cold":
        from router.bench.cold.cli import main as cold

        return cold(argv[1:])
    if argv and argv[0] == "overhead":
        from router.bench.overhead.cli import main as overhead

        return overhead(argv[1:])
    from router.bench.scorecard.cli import main as scorecard

    return scorecard(argv)
