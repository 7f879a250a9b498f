"""The shared worker's scheduler: the two lanes take turns on one generation thread.

The lanes here are scripted (a number of turns of work each) around the real scheduler loop
and the real job queues, so the order of turns is exact.
"""

from __future__ import annotations

import threading

from router.worker.engine import Models
from router.worker.jobs import JobQueue
from router.worker.shared import SharedEngine
from router.worker.speculative import SpecSettings

TIMEOUT = 10.0


class ScriptedLane:
    """Has ``work`` turns to take; each turn is written to the shared ``trace``."""

    def __init__(self, name: str, work: int, trace: list[str], queue: JobQueue) -> None:
        self.name, self.work, self.trace, self.queue = name, work, trace, queue

    @property
    def busy(self) -> bool:
        return self.work > 0

    def _turn(self) -> None:
        assert self.work > 0, f"{self.name} was given a turn without work"
        self.work -= 1
        self.trace.append(self.name[0])

    # the speculative lane's side
    def take(self, models: Models) -> bool:
        return self.busy

    def round(self) -> None:
        self._turn()

    # the batching lane's side
    def open_batch(self, models: Models) -> None:
        pass

    def close_batch(self) -> None:
        pass

    def admit(self, models: Models) -> None:
        pass

    def step(self, models: Models, others_waiting: bool = False) -> None:
        self._turn()


def run(spec_work: int, batch_work: int) -> list[str]:
    engine = SharedEngine(
        lambda: Models(None, None),
        SpecSettings(draft_source="none"),
        4,
        prompt_cache_bytes=0,
        prefill_step_size=64,
        chunk_seconds=0.5,
    )
    trace: list[str] = []
    spec = ScriptedLane("speculative", spec_work, trace, engine.speculative.queue)
    batch = ScriptedLane("batching", batch_work, trace, engine.batching.queue)
    engine.speculative, engine.batching = spec, batch  # type: ignore[assignment]
    thread = threading.Thread(target=engine._serve, args=(Models(None, None),), daemon=True)
    thread.start()
    for queue in (spec.queue, batch.queue):  # no more jobs: the loop ends once both are idle
        queue.close()
    thread.join(TIMEOUT)
    assert not thread.is_alive(), "the scheduler did not stop"
    return trace


def test_the_lanes_alternate_while_both_have_work() -> None:
    assert "".join(run(3, 3)) == "sbsbsb"


def test_a_stream_of_speculative_rounds_never_starves_the_batch() -> None:
    trace = "".join(run(10, 3))
    assert trace == "sbsbsb" + "s" * 7


def test_a_busy_batch_never_starves_the_speculative_lane() -> None:
    assert "".join(run(2, 6)) == "sbsb" + "b" * 4


def test_an_idle_lane_gives_its_turn_away() -> None:
    assert run(0, 3) == ["b"] * 3 and run(3, 0) == ["s"] * 3
