"""router.lanes.memory: sizes on disk, the machine's memory, a process's RSS and PSS."""

from __future__ import annotations

import os
from pathlib import Path

from router.lanes.layout import Memory
from router.lanes.memory import machine_memory, process_memory, weights_bytes


def test_weights_are_the_weight_files_of_a_local_directory(tmp_path: Path) -> None:
    (tmp_path / "model.safetensors").write_bytes(b"x" * 1000)
    (tmp_path / "model-2.safetensors").write_bytes(b"x" * 24)
    (tmp_path / "tokenizer.json").write_bytes(b"x" * 500)
    (tmp_path / "config.json").write_text("{}")
    assert weights_bytes(str(tmp_path)) == 1024
    assert weights_bytes("org/some-hub-repo") == 0 and weights_bytes(None) == 0


def test_the_machines_memory_is_read_or_overridden() -> None:
    assert machine_memory(5 << 30) == Memory(5 << 30, 5 << 30)
    real = machine_memory()
    assert real.total > 0 and 0 < real.available <= real.total


def test_a_live_process_has_a_resident_and_a_proportional_size() -> None:
    figures = process_memory(os.getpid())
    assert figures is not None
    assert figures["rss_bytes"] >= figures["pss_bytes"] > 0
    assert process_memory(2**22 + 7) is None  # no such process
