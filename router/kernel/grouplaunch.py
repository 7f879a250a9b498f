"""What the router and a group's ranks (``router.worker.group``) both apply to a group of
ranks: files only this user may read (the launch arguments the router writes, each local
rank's script the launcher writes), and the tensor split a model's heads allow (checked by
the router before it launches anything, and by each rank before it loads its shard)."""

from __future__ import annotations

import json
import os
from pathlib import Path

from router.kernel.errors import LoadError


def write_private(path: Path, text: str) -> None:
    """``text`` into a new file only this user may read or write (0600, never an old one)."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w", encoding="utf-8") as f:
        f.write(text)


def check_split(model_dir: Path, ranks: int, parallel: str) -> None:
    """Refuse, in one line naming what to change, a tensor split the model's heads do not
    allow (mlx-lm's ``shard()`` would divide them silently and compute garbage)."""
    if parallel != "tensor":
        return
    try:
        config = json.loads((model_dir / "config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError) as e:
        raise LoadError(f"{model_dir}: cannot read config.json: {e}") from e
    text = config.get("text_config", config)
    for key in ("num_attention_heads", "num_key_value_heads", "intermediate_size"):
        value = text.get(key)
        if isinstance(value, int) and value % ranks:
            raise LoadError(
                f"{model_dir.name}: {key} = {value} does not split over {ranks} ranks for "
                "tensor parallelism; change [lanes.group] hosts to a divisor of it, or "
                'parallel = "pipeline" for a model that has pipeline()'
            )
