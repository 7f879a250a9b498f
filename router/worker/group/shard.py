"""Loading this rank's shard of the target (mlx-lm's ``sharded_load``) and running it."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from router.kernel.errors import LoadError
from router.kernel.grouplaunch import check_split


def load_shard(model_dir: Path, parallel: str, group: Any) -> tuple[Any, Any]:
    """(model, tokenizer) of this rank: its slice of every layer (tensor) or its layers
    (pipeline). The last step is a barrier: every rank has loaded when it returns."""
    from mlx_lm.utils import sharded_load

    check_split(model_dir, int(group.size()), parallel)
    try:
        model, tokenizer = sharded_load(
            str(model_dir),
            pipeline_group=group if parallel == "pipeline" else None,
            tensor_group=group if parallel == "tensor" else None,
        )[:2]
    except ValueError as e:  # "does not support tensor parallelism", ...
        raise LoadError(f"{model_dir.name}: {e}; change [lanes.group] parallel") from e
    return model, tokenizer


class MlxShard:
    """``mirror.Shard`` on an MLX model."""

    def __init__(self, model: Any) -> None:
        self.model = model

    def fresh(self) -> Any:
        from mlx_lm.models.cache import make_prompt_cache

        return make_prompt_cache(self.model)

    def forward(self, cache: Any, tokens: list[int]) -> None:
        import mlx.core as mx

        # Evaluate the whole output, as rank 0 does: every collective inside the pass runs.
        mx.eval(self.model(mx.array(tokens, mx.uint32)[None], cache=cache))

    def length(self, cache: Any) -> int:
        return cache_length(cache)

    def trim(self, cache: Any, n: int) -> None:
        from mlx_lm.models.cache import trim_prompt_cache

        trim_prompt_cache(cache, n)


def cache_length(cache: list[Any]) -> int:
    """Positions a KV cache holds (the most any layer holds)."""
    offsets = [o for layer in cache if isinstance(o := getattr(layer, "offset", None), int)]
    if not offsets:
        raise ValueError("a cache without positions cannot follow rank 0's")
    return max(offsets)
