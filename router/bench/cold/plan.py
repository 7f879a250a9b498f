"""``speclane bench cold``: what runs in which order, what is sent, and the router's
configuration for each mode (pure)."""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

Mode = Literal["startup", "on-demand"]
MODES: tuple[Mode, ...] = ("startup", "on-demand")
SPECLANE = "speclane"
MLX_LM = "mlx_lm.server"
SIDES = (SPECLANE, MLX_LM)
MLX_LM_MODEL = "default_model"  # what mlx_lm.server calls the model given by --model
# The two names the model is served under in on-demand mode: loaded at start-up, and not.
LOADED, COLD = "cold-bench-a", "cold-bench-b"


@dataclass(frozen=True)
class Step:
    round: int  # from 1
    side: str


def schedule(rounds: int, sides: tuple[str, ...] = SIDES) -> list[Step]:
    """Every side once per round; the order turns each round, so that neither side is
    always the one measured first (after the other has warmed the machine)."""
    steps = []
    for r in range(rounds):
        turn = r % len(sides)
        steps += [Step(r + 1, side) for side in sides[turn:] + sides[:turn]]
    return steps


def question(i: int) -> list[dict[str, str]]:
    """A short chat, different for each ``i``: no prompt cache answers a later one."""
    return [{"role": "user", "content": f"Question {i}: name one city in a country you like."}]


def body(model: str, i: int, max_tokens: int) -> dict[str, Any]:
    return {
        "model": model,
        "messages": question(i),
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
    q = json.dumps  # a JSON string is a valid TOML basic string
    model = models_dir / LOADED if mode == "on-demand" and models_dir else model_dir
    lines = [
        f"policies_dir = {q(str(policies_dir))}",
        'log_level = "info"',
        "shutdown_grace = 2",
        "[lanes]",
        f"model = {q(str(model))}",
        f"layout = {q(layout)}",
    ]
    if mode == "on-demand":
        if models_dir is None:
            raise ValueError("on-demand mode needs a models_dir")
        lines.append(f"models_dir = {q(str(models_dir))}")
    return "\n".join(lines) + "\n"


def served_name(mode: Mode, model_dir: Path) -> str:
    """The model name the first requests to speclane send (the lanes' model)."""
    return LOADED if mode == "on-demand" else model_dir.name
