"""``speclane bench cold``: what runs in which order, what is sent, and the router's
configuration in each mode (pure)."""

from __future__ import annotations

import json
from collections.abc import Iterable
from pathlib import Path
from typing import Any, Literal

Mode = Literal["startup", "on-demand"]
MODES: tuple[Mode, ...] = ("startup", "on-demand")
SPECLANE, MLX_LM = "speclane", "mlx_lm.server"
MLX_LM_MODEL = "default_model"  # what mlx_lm.server calls the model given by --model
# The two names the model is served under in on-demand mode: loaded at start-up, and not.
LOADED, COLD = "cold-bench-a", "cold-bench-b"


def schedule(rounds: int) -> list[tuple[int, str]]:
    """(round from 1, side): both sides each round, the first one alternating, so that
    neither is always measured after the other has warmed the machine."""
    sides = (SPECLANE, MLX_LM)
    return [(r + 1, side) for r in range(rounds) for side in (sides if r % 2 == 0 else sides[::-1])]


def body(model: str, i: int, max_tokens: int) -> dict[str, Any]:
    """A short streamed chat, different for each ``i``: no prompt cache answers a later one."""
    question = f"Question {i}: name one city in a country you like."
    messages = [{"role": "user", "content": question}]
    return {
        "model": model,
        "messages": messages,
        "max_tokens": max_tokens,
        "temperature": 0,
        "stream": True,
    }


def model_links(model_dir: Path, files: Iterable[str], into: Path) -> list[tuple[Path, Path]]:
    """(link, target) for both names of on-demand mode: two real folders whose files link to
    the one model, so a router that tells models apart by their real path sees two."""
    return [(into / name / f, model_dir / f) for name in (LOADED, COLD) for f in sorted(files)]


def speclane_config(
    mode: Mode, model_dir: Path, policies_dir: Path, models_dir: Path | None, layout: str
) -> str:
    """The router's configuration file. on-demand: ``models_dir`` serves every folder in it
    under its name; the lanes start on the first (``LOADED``)."""
    if mode == "on-demand" and models_dir is None:
        raise ValueError("on-demand mode needs a models_dir")
    q = json.dumps  # a JSON string is a valid TOML basic string
    model = models_dir / LOADED if mode == "on-demand" and models_dir else model_dir
    lines = [f"policies_dir = {q(str(policies_dir))}", 'log_level = "info"', "shutdown_grace = 2"]
    lines += ["[lanes]", f"model = {q(str(model))}", f"layout = {q(layout)}"]
    if mode == "on-demand":
        lines.append(f"models_dir = {q(str(models_dir))}")
    return "\n".join(lines) + "\n"


def served_name(mode: Mode, model_dir: Path) -> str:
    """The model name the first requests to speclane send (the lanes' model)."""
    return LOADED if mode == "on-demand" else model_dir.name
