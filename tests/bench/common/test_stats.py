"""The shared statistics and the Markdown table every benchmark prints."""

from __future__ import annotations

import pytest

from router.bench.common.stats import fmt, mean, percentile, ratio, table


def test_statistics() -> None:
    assert percentile([1.0, 2.0, 3.0, 4.0], 50) == pytest.approx(2.5)
    assert percentile([], 95) is None
    assert mean([1.0, None, 3.0]) == 2.0 and mean([None]) is None
    assert ratio(3.0, 2.0) == 1.5 and ratio(1.0, 0.0) is None and ratio(None, 1.0) is None
    assert fmt(None) == "-" and fmt(1.234) == "1.23"


def test_table_aligns_its_columns_and_keeps_empty_cells_narrow() -> None:
    assert table(["a", "b", "c"], [[1, "", "x"]], "lr") == [
        "| a | b | c |",
        "| --- | ---: | --- |",
        "| 1 | | x |",
    ]
