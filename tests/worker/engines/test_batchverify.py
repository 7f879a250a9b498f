"""The batched verify step's pieces: the accepted prefix, a row's draft as verified (a
constrained row's with its grammar's masks), and trimming the rows of a ``BatchKVCache``
apart (on a real mlx-lm cache, no model)."""

from __future__ import annotations

from typing import Any

import numpy as np

from router.worker.drafting.forced import Draft
from router.worker.engines.batchverify import (
    accepted_prefix,
    fitted,
    grammar_masked,
    row_trims,
    tokens_of,
    trim_rows,
    trimmable,
)


def test_the_accepted_prefix() -> None:
    assert accepted_prefix([], [7]) == 0
    assert accepted_prefix([1, 2, 3], [1, 2, 3, 4]) == 3
    assert accepted_prefix([1, 2, 3], [1, 5, 3, 4]) == 1
    assert accepted_prefix([1, 2, 3], [9, 2, 3, 4]) == 0


def test_row_trims_drop_what_every_row_rejects_and_roll_the_rest() -> None:
    assert row_trims(5, [5, 5]) == (0, [0, 0])
    assert row_trims(5, [1, 3, 5]) == (0, [4, 2, 0])
    assert row_trims(5, [1, 2]) == (3, [1, 0])


def test_rows_that_keep_different_lengths_hold_exactly_their_tokens() -> None:
    import mlx.core as mx
    from mlx_lm.models.cache import BatchKVCache, KVCache, RotatingKVCache

    def single(values: list[float]) -> KVCache:
        c = KVCache()
        x = mx.array(values, dtype=mx.float32).reshape(1, 1, len(values), 1)
        c.update_and_fetch(x, x)
        return c

    batch = BatchKVCache.merge([single([1, 2, 3]), single([4, 5])])
    assert trimmable([batch]) and not trimmable([RotatingKVCache(8)]) and not trimmable([])
    # One verify pass of width 4: row 0 keeps 2 positions, row 1 keeps 4.
    new = mx.array([[10, 11, 12, 13], [20, 21, 22, 23]], dtype=mx.float32).reshape(2, 1, 4, 1)
    batch.update_and_fetch(new, new)
    trim_rows([batch], 4, [2, 4])
    first, second = batch.extract(0), batch.extract(1)
    assert first.keys.reshape(-1).tolist() == [1, 2, 3, 10, 11]
    assert second.keys.reshape(-1).tolist() == [4, 5, 20, 21, 22, 23]
    assert batch.offset.tolist() == [5, 6]  # each row's own length: its next positions
    # The next step appends after each row's own tokens.
    step = mx.array([[14], [24]], dtype=mx.float32).reshape(2, 1, 1, 1)
    batch.update_and_fetch(step, step)
    assert batch.extract(0).keys.reshape(-1).tolist() == [1, 2, 3, 10, 11, 14]
    assert batch.extract(1).keys.reshape(-1).tolist() == [4, 5, 20, 21, 22, 23, 24]
    # Padding is masked: a next token of row 0 sees its 6 positions and itself, no more.
    mask = batch.make_mask(1)
    assert mask.reshape(2, -1).sum(axis=1).tolist() == [7, 8]


def test_the_batching_worker_reports_its_table_and_suffix_index() -> None:
    from router.worker.drafting.draftlength import BATCH_DRAFT_TABLE
    from router.worker.engines.batching import BatchingEngine

    def never() -> Any:
        raise AssertionError("not started")

    report = BatchingEngine(never, 4).report()  # what /health adds
    assert report["draft_table"] == [list(row) for row in BATCH_DRAFT_TABLE]
    assert report["suffix_index"] == {
        "entries": 0,
        "bytes": 0,
        "max_bytes": 64 << 20,
        "evicted": 0,
        "partitions": 0,
        "largest_partition_bytes": 0,
    }


def grammar_draft(tokens: list[int], vocab: int = 6) -> Draft:
    """A draft whose row ``i`` allows ``i`` and the token drafted there only."""
    rows = np.zeros((len(tokens) + 1, vocab), dtype=bool)
    for i in range(len(tokens) + 1):
        rows[i, i] = True
    for i, token in enumerate(tokens):
        rows[i, token] = True
    return Draft(tokens, [True] * len(tokens), rows)


def test_a_rows_draft_fits_its_room_and_drafts_under_processors_only_with_masks() -> None:
    assert fitted([1, 2, 3], 3, False) == [1, 2]  # the pending token takes one of 3 left
    assert fitted([1, 2, 3], 1, False) == []
    assert fitted([1, 2, 3], 9, True) == []  # penalties or a bias: never drafts
    draft = grammar_draft([3, 4, 5])
    cut = fitted(draft, 3, True)  # a grammar: its masks stand in for its processors
    assert isinstance(cut, Draft) and cut.tokens == [3, 4] and cut.forced == [True, True]
    assert np.array_equal(cut.rows, draft.rows[:3])
    assert fitted(draft, 9, True) is draft
    assert fitted(grammar_draft([]), 9, True) == []  # nothing drafted: the processors mask
    assert tokens_of(cut) == [3, 4] and tokens_of([7]) == [7]


def test_a_constrained_rows_positions_are_masked_by_their_rows_and_padding_is_not() -> None:
    import mlx.core as mx

    logits = mx.zeros((4, 6))  # the pending token, a draft of 2, one position of padding
    out = np.array(grammar_masked(grammar_draft([3, 4]), logits))
    allowed = [set(np.flatnonzero(np.isfinite(row)).tolist()) for row in out]
    assert allowed == [{0, 3}, {1, 4}, {2}, set(range(6))]
