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


def tiny_pipeline_config(vocab_size: int) -> dict[str, object]:
    """A tiny ministral3: a llama-like model with mlx-lm's ``pipeline()`` (layers split
    between ranks)."""
    config = tiny_config(vocab_size)
    config.update(
        model_type="ministral3",
        architectures=["Mistral3ForCausalLM"],
        num_hidden_layers=4,
        rope_parameters={
            "rope_type": "default",
            "rope_theta": 10000.0,
            "llama_4_scaling_beta": 0.1,
            "original_max_position_embeddings": 2048,
        },
    )
    del config["rope_theta"]
    return config


def make_tiny_model(
    dst: Path, tokenizer_source: Path, seed: int = 0, pipeline: bool = False
) -> Path:
    """Write a random tiny llama (``pipeline``: a tiny ministral3) into ``dst`` (float32, the
    tokenizer of ``tokenizer_source``)."""
    import importlib
    import json

    import mlx.core as mx
    from mlx_lm.utils import save_config, save_model

    source_config = json.loads((tokenizer_source / "config.json").read_text())
    vocab = int(source_config["vocab_size"])
    config = tiny_pipeline_config(vocab) if pipeline else tiny_config(vocab)
    arch = importlib.import_module(f"mlx_lm.models.{config['model_type']}")
    Model, ModelArgs = arch.Model, arch.ModelArgs
    mx.random.seed(seed)
    model = Model(ModelArgs.from_dict(config))
    mx.eval(model.parameters())
    save_model(dst, model)
    save_config(dict(config), dst / "config.json")
    for name in TOKENIZER_FILES:
        if (tokenizer_source / name).is_file():
            shutil.copy(tokenizer_source / name, dst / name)
    return dst
