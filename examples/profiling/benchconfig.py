"""The profiling scripts' router configuration (no speclane imports: ``idle_cpu.py`` also
runs against older trees)."""

from __future__ import annotations

from pathlib import Path


def bench_config(tmp: str, upstream_url: str) -> Path:
    """A configuration with one OpenAI-style backend (the bench upstream) and no lanes."""
    config = Path(tmp) / "speclane.toml"
    (Path(tmp) / "policies").mkdir()
    config.write_text(
        f'policies_dir = "{tmp}/policies"\nlog_level = "warning"\n'
        f'[lanes]\nenabled = false\n[[backends]]\nname = "bench"\nkind = "openai"\n'
        f'base_url = "{upstream_url}"\n'
    )
    return config
