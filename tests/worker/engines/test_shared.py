"""The shared worker's scheduler: the two lanes take turns on one generation thread, or each
runs on its own.

The lanes here are scripted (a number of turns of work each) around the real scheduler loops
and the real job queues, so the order of turns is exact.
"""

from __future__ import annotations

import threading

from router.worker.engines.engine import Models
from router.worker.engines.jobs import JobQueue
from router.worker.engines.shared import SharedEngine, materialize, threads_for
from router.worker.engines.speculative import SpeculativeConfig

TIMEOUT = 10.0


class ScriptedLane:
    """Has ``work`` turns to take; each turn is written to the shared ``trace``."""

    def __init__(self, name: str, work: int, trace: list[str], queue: JobQueue) -> None:
        self.name, self.work, self.trace, self.queue = name, work, trace, queue
        self.calibrated = False

    @property
    def busy(self) -> bool:
        return self.work > 0

    def _turn(self) -> None:
        assert self.work > 0, f"{self.name} was given a turn without work"
        self.work -= 1
        self.trace.append(self.name[0])

    # the speculative lane's side
    def calibrate_at_start(self, models: Models) -> None:
        self.calibrated = True  # the draft model timed as the lane starts

    def take(self, models: Models) -> bool:
        return self.busy

    def round(self) -> None:
        assert self.calibrated, "a speculative round before the lane was calibrated"
        self._turn()

    # the batching lane's side
    def open_batch(self, models: Models) -> None:
        pass

    def close_batch(self) -> None:
        pass

    def admit(self, models: Models, block: bool = False) -> None:
        if block:  # the two-thread loop sleeps here while the lane is idle
            self.queue.get(block=True)

    def step(self, models: Models, others_waiting: bool = False) -> None:
        self._turn()


def run(spec_work: int, batch_work: int) -> list[str]:
    engine = shared_engine(1)
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


def shared_engine(threads: int) -> SharedEngine:
    return SharedEngine(
        lambda: Models(None, None),
        SpeculativeConfig(draft_source="none"),
        4,
        prompt_cache_bytes=0,
        prefill_step_size=64,
        chunk_seconds=0.5,
        threads=threads,
    )


def test_the_lanes_alternate_while_both_have_work() -> None:
    assert "".join(run(3, 3)) == "sbsbsb"


def test_a_stream_of_speculative_rounds_never_starves_the_batch() -> None:
    trace = "".join(run(10, 3))
    assert trace == "sbsbsb" + "s" * 7


def test_a_busy_batch_never_starves_the_speculative_lane() -> None:
    assert "".join(run(2, 6)) == "sbsb" + "b" * 4


def test_an_idle_lane_gives_its_turn_away() -> None:
    assert run(0, 3) == ["b"] * 3 and run(3, 0) == ["s"] * 3


class StuckLane(ScriptedLane):
    """A speculative lane whose every round waits until the batch has finished its work."""

    def __init__(self, trace: list[str], queue: JobQueue, batch_done: threading.Event) -> None:
        super().__init__("speculative", 2, trace, queue)
        self.batch_done = batch_done

    def take(self, models: Models) -> bool:
        if not self.busy:
            self.queue.get(block=False)  # its one job is done
        return self.busy

    def round(self) -> None:
        assert self.batch_done.wait(TIMEOUT), "the batch made no progress during a round"
        self._turn()


class CountedLane(ScriptedLane):
    def __init__(self, work: int, trace: list[str], queue: JobQueue) -> None:
        super().__init__("batching", work, trace, queue)
        self.done = threading.Event()

    def step(self, models: Models, others_waiting: bool = False) -> None:
        assert not others_waiting  # on its own thread, the batch keeps its one-lane chunks
        self._turn()
        if not self.busy:
            self.done.set()


def test_with_two_threads_each_lane_progresses_on_its_own() -> None:
    """A speculative round that lasts (here: until the batch is done) does not hold the batch
    up: on one thread taking turns, this would wait forever."""
    engine = shared_engine(2)
    trace: list[str] = []
    batch = CountedLane(5, trace, engine.batching.queue)
    spec = StuckLane(trace, engine.speculative.queue, batch.done)
    engine.speculative, engine.batching = spec, batch  # type: ignore[assignment]
    spec.queue.put(object())  # type: ignore[arg-type]  # one job for the lane to wake up to
    batch.queue.put(object())  # type: ignore[arg-type]
    threads = [
        threading.Thread(target=serve, args=(Models(None, None),), daemon=True)
        for serve in (engine._serve_speculative, engine._serve_batching)
    ]
    for thread in threads:
        thread.start()
    assert batch.done.wait(TIMEOUT)
    for queue in (spec.queue, batch.queue):
        queue.close()
    for thread in threads:
        thread.join(TIMEOUT)
        assert not thread.is_alive(), "a lane's loop did not stop"
    assert trace.count("b") == 5 and trace.count("s") == 2
    assert trace.index("s") >= 5  # the first round ended only after the batch's 5 steps
    assert engine.turns == {"speculative": 2, "batching": 5}


def test_two_threads_where_the_lanes_can_compute_at_once() -> None:
    assert threads_for("auto", 2, on_cpu=True, blas_threads="1") == 2
    assert threads_for("auto", 2, on_cpu=True) == 1  # a multi-threaded BLAS uses the cores
    assert threads_for("auto", 2, on_cpu=True, blas_threads="2") == 1
    assert threads_for("auto", 1, on_cpu=True, blas_threads="1") == 1  # one core
    assert threads_for("auto", 8, on_cpu=False, blas_threads="1") == 1  # one GPU
    assert threads_for("auto", None, on_cpu=True, blas_threads="1") == 1
    assert (threads_for("1", 8, True), threads_for("2", 1, False)) == (1, 2)


def test_the_loaded_models_can_be_used_from_another_thread() -> None:
    """Every array a model holds, a lazy private one too, is evaluated where it was made:
    MLX cannot evaluate a lazy array on another thread."""
    import mlx.core as mx
    import mlx.nn as nn

    made: list[nn.Module] = []

    def load() -> None:
        model = nn.Linear(4, 2)
        model._scale = mx.ones((2,)) * 3  # lazy, and not a parameter
        materialize(Models(model, None))
        made.append(model)

    loader = threading.Thread(target=load)
    loader.start()
    loader.join(TIMEOUT)
    (model,) = made
    out = model(mx.ones((1, 4))) * model._scale  # here, on another thread
    mx.eval(out)
    assert out.shape == (1, 2)
