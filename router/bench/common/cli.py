"""What the benchmarks' command lines share: comma-separated list arguments, and saving the
results as JSON after printing them."""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any


def csv(
    kind: Callable[[str], Any], choices: Sequence[str] = ()
) -> Callable[[str], tuple[Any, ...]]:
    """An argparse ``type``: a non-empty comma-separated list of ``kind`` (among ``choices``)."""

    def parse(text: str) -> tuple[Any, ...]:
        try:
            values = tuple(kind(v.strip()) for v in text.split(",") if v.strip())
        except ValueError as e:
            raise argparse.ArgumentTypeError(f"not a comma-separated list: {text!r}") from e
        if not values:
            raise argparse.ArgumentTypeError("empty list")
        if bad := [v for v in values if choices and v not in choices]:
            raise argparse.ArgumentTypeError(
                f"unknown: {', '.join(bad)} (choose from {', '.join(choices)})"
            )
        return values

    return parse


def save(path: Path, results: object) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(results, indent=2) + "\n", encoding="utf-8")
    print(f"\nsaved {path}")
