"""The batching lane's generator as every rank of a group runs it (rank 0 and the others
alike): mlx-lm's ``BatchGenerator`` with a decoding batch of the rank's own class
(``batchlead.LeaderBatch`` on rank 0, ``batchmirror.MirrorBatch`` on the others), over the
target wrapped in ``SyncModel``.

``SyncModel`` evaluates every pass before it returns, so that no rank leaves a pass's
collectives pending while it exchanges the next message (collectives pair up in the order
the ranks run them). A decoding or verify pass, or a narrow prefill chunk, is evaluated
whole; a wide prefill chunk over a tensor split only as far as its KV caches (mlx-lm
discards a prefill chunk's output on every rank, so the last layer's collectives are left
out on every rank alike, and no rank computes the logits of thousands of positions it never
reads). A pipeline split always evaluates the whole output: the pass's sends and receives
between the ranks are only in its graph.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import cache
from typing import Any

WHOLE_WIDTH = 64  # a pass at most this wide is evaluated whole (a decoding step, a verify)


class SyncModel:
    """The target, each pass evaluated before it returns."""

    def __init__(self, model: Any, whole: bool = False) -> None:
        self._model = model
        self._whole = whole  # always the whole output (a pipeline split)

    def __call__(self, inputs: Any, cache: Any = None, **kwargs: Any) -> Any:
        import mlx.core as mx

        out = self._model(inputs, cache=cache, **kwargs)
        if self._whole or inputs.shape[-1] <= WHOLE_WIDTH or not cache:
            mx.eval(out)
        else:
            mx.eval([c.state for c in cache])
        return out

    def __getattr__(self, name: str) -> Any:
        return getattr(self._model, name)


@cache
def generator_class() -> type:
    """``BatchGenerator`` telling ``before_next`` (rank 0: ``BATCH_NEXT`` to the others) the
    step's prefill size before each ``next()``; made on first use (mlx-lm is imported on the
    generation thread)."""
    from mlx_lm.generate import BatchGenerator

    class GroupGenerator(BatchGenerator):
        before_next: Callable[[int], None] | None = None

        def next(self) -> Any:
            if self.before_next is not None:
                self.before_next(int(self.prefill_step_size))
            return super().next()

    return GroupGenerator


def group_generator(
    model: Any, batch_class: type, drafter: Callable[..., Any] | None, **options: Any
) -> Any:
    """A ``BatchGenerator`` over ``model`` whose decoding batch is a ``batch_class`` (a
    ``batchverify.batch_class()`` subclass), as ``batchverify.drafting_generator`` makes it."""
    generator = generator_class()(model, **options)
    batch: Any = batch_class.empty(model, generator.sampler)  # type: ignore[attr-defined]
    batch.drafter = drafter
    generator._generation_batch = batch
    return generator


def generator_options(capacity: int, eos: list[int], prefill_step_size: int) -> dict[str, Any]:
    """The batching lane's ``BatchGenerator`` options (``BatchingEngine._new_generator``), the
    same on every rank."""
    return {
        "stop_tokens": [[t] for t in eos],
        "completion_batch_size": capacity,
        "prefill_batch_size": min(capacity, 8),
        "prefill_step_size": prefill_step_size,
    }
