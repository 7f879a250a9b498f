"""A tiny random llama for the group's tests: even head counts (it splits two ways for
tensor parallelism), a few layers, the default model's tokenizer, saved with mlx-lm's own
save functions, so a group of ranks loads it in seconds."""

from __future__ import annotations

import shutil
from pathlib import Path

TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja")


def tiny_config(vocab_size: int) -> dict[str, object]:
    return {
        "model_type": "llama",
        "architectures": ["LlamaForCausalLM"],
        "hidden_size": 64,
        "num_hidden_layers": 3,
        "intermediate_size": 128,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "head_dim": 16,
        "rms_norm_eps": 1e-05,
        "vocab_size": vocab_size,
        "rope_theta": 10000.0,
        "max_position_embeddings": 2048,
        "tie_word_embeddings": True,
        "bos_token_id": 1,
        "eos_token_id": 2,
    }


def make_tiny_model(dst: Path, tokenizer_source: Path, seed: int = 0) -> Path:
    """Write a random tiny llama into ``dst`` (float32, the tokenizer of ``tokenizer_source``)."""
    import json

    import mlx.core as mx
    from mlx_lm.models.llama import Model, ModelArgs
    from mlx_lm.utils import save_config, save_model

    source_config = json.loads((tokenizer_source / "config.json").read_text())
    config = tiny_config(int(source_config["vocab_size"]))
    mx.random.seed(seed)
    model = Model(ModelArgs.from_dict(config))
    mx.eval(model.parameters())
    save_model(dst, model)
    save_config(dict(config), dst / "config.json")
    for name in TOKENIZER_FILES:
        if (tokenizer_source / name).is_file():
            shutil.copy(tokenizer_source / name, dst / name)
    return dst
