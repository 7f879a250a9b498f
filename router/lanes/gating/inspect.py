"""``check_pair``: read a target and a draft model directory and report whether they can speculate.

Cheap by design (it runs before the lanes start): configs, safetensors headers and the two
tokenizers are read; no weights are loaded. The architecture is checked the way mlx-lm loads
it (``mlx_lm.models.<model_type>`` after its remapping), and its prompt cache is built on an
unevaluated model (MLX arrays are lazy, so this allocates nothing) to see whether rejected
draft tokens can be rewound: mlx-lm's speculative decoding requires a trimmable cache.

The tokenizers are loaded with mlx-lm's own ``load_tokenizer``, so the chat template, special
tokens and eos ids are those the worker will use. The comparisons are in
``router.lanes.gating.compare``.
"""

from __future__ import annotations

import importlib
import json
import struct
from pathlib import Path
from typing import Any

from router.lanes.gating.compare import Findings, Inspected, compare_pair
from router.lanes.gating.findings import DRAFT_SETTING, TARGET_SETTING, ModelFacts, PairReport

# Model types that are vision/audio models even where mlx-lm can load their text part.
MULTIMODAL_MODEL_TYPES = frozenset(
    {
        "llava",
        "llava_next",
        "llava_onevision",
        "mllama",
        "idefics2",
        "idefics3",
        "smolvlm",
        "pixtral",
        "paligemma",
        "qwen2_vl",
        "qwen2_5_vl",
        "qwen3_vl",
        "qwen3_vl_moe",
        "qwen2_5_omni",
        "qwen3_omni_moe",
        "gemma3",
        "gemma3n",
        "mistral3",
        "llama4",
        "kimi_vl",
        "internvl_chat",
        "phi3_v",
        "phi4mm",
        "florence2",
        "molmo",
        "deepseek_vl_v2",
        "glm4v",
        "glm4v_moe",
        "lfm2_vl",
        "aya_vision",
    }
)
# config.json keys that only multimodal models carry.
MULTIMODAL_KEYS = (
    "vision_config",
    "audio_config",
    "vision_tower",
    "mm_projector_type",
    "image_token_index",
    "image_token_id",
    "video_token_id",
    "speech_config",
)

_MAX_HEADER = 100 * 1024 * 1024  # a safetensors header is JSON; this size means garbage


def check_pair(target: str | Path, draft: str | Path | None) -> PairReport:
    found = Findings()
    # Without a draft there is no pair to compare: the target's tokenizer (the slow part) is
    # left to the worker, which reports a broken one when it loads.
    t = _inspect(str(target), TARGET_SETTING, found, tokenizer=draft is not None)
    if draft is None:
        found.problem(
            "no_draft", "speculation is requested but no draft model is configured", DRAFT_SETTING
        )
        return _report(t, None, found)
    d = _inspect(str(draft), DRAFT_SETTING, found)
    compare_pair(t, d, found)
    return _report(t, d, found)


def _report(t: Inspected, d: Inspected | None, found: Findings) -> PairReport:
    return PairReport(
        target=t.name,
        draft=d.name if d else None,
        problems=tuple(found.problems),
        warnings=tuple(found.warnings),
        target_facts=_facts(t),
        draft_facts=_facts(d) if d else None,
    )


def _facts(m: Inspected) -> ModelFacts:
    vocab = m.config.get("vocab_size")
    return ModelFacts(
        path=str(m.path or m.name),
        model_type=m.config.get("model_type"),
        weight_bytes=m.weight_bytes,
        tokenizer_size=len(m.vocab) if m.tokenizer is not None else None,
        config_vocab_size=vocab if isinstance(vocab, int) else None,
    )


# --- one model ---------------------------------------------------------------------------------


def _inspect(name: str, setting: str, found: Findings, *, tokenizer: bool = True) -> Inspected:
    m = Inspected(name, setting)
    m.path = _resolve(name, setting, found)
    if m.path is None:
        return m
    config = _read_config(m.path, setting, found)
    if config is None:
        return m
    m.config = config
    m.weight_bytes = _weight_bytes(m.path, setting, found)
    _check_architecture(m, found)
    if tokenizer:
        m.tokenizer = _load_tokenizer(m, found)
    return m


def _resolve(name: str, setting: str, found: Findings) -> Path | None:
    path = Path(name).expanduser()
    if path.is_dir():
        return path
    if path.exists():
        found.problem("model_not_found", f"{name} is a file, not a model directory", setting)
        return None
    cached = _hf_cache(name)
    if cached is not None:
        return cached
    found.problem(
        "model_not_found",
        f"{name} is not a local directory and not in the Hugging "
        "Face cache (download it first, or point the setting at a model directory)",
        setting,
    )
    return None


def _hf_cache(name: str) -> Path | None:
    """A repo id already downloaded (``huggingface-cli download``); never goes online."""
    if name.startswith(("/", ".", "~")) or name.count("/") != 1:
        return None
    try:
        from huggingface_hub import snapshot_download

        return Path(snapshot_download(name, local_files_only=True))
    except Exception:  # not cached, or not a valid repo id: the caller reports it
        return None


def _read_config(path: Path, setting: str, found: Findings) -> dict[str, Any] | None:
    file = path / "config.json"
    try:
        config = json.loads(file.read_text(encoding="utf-8"))
    except FileNotFoundError:
        found.problem(
            "config_invalid", f"{path} has no config.json: not an mlx-lm model directory", setting
        )
        return None
    except (OSError, ValueError) as e:
        found.problem("config_invalid", f"{file} cannot be read: {e}", setting)
        return None
    if not isinstance(config, dict) or not isinstance(config.get("model_type"), str):
        found.problem("config_invalid", f"{file} has no model_type", setting)
        return None
    return config


def _weight_bytes(path: Path, setting: str, found: Findings) -> int | None:
    files = sorted(path.glob("model*.safetensors"))  # the files mlx-lm loads
    if not files:
        hint = " (a GGUF file must be converted first)" if any(path.glob("*.gguf")) else ""
        found.problem("weights_missing", f"{path} has no model*.safetensors{hint}", setting)
        return None
    total = 0
    for file in files:
        try:
            total += safetensors_data_bytes(file)
        except (OSError, ValueError) as e:
            found.problem("weights_invalid", f"{file.name}: {e}", setting)
            return None
    return total


def safetensors_data_bytes(file: Path) -> int:
    """The tensor bytes a safetensors file declares, checked against its size (truncation)."""
    with file.open("rb") as f:
        head = f.read(8)
        if len(head) < 8:
            raise ValueError("shorter than a safetensors header")
        (length,) = struct.unpack("<Q", head)
        if length > _MAX_HEADER:
            raise ValueError("not a safetensors file (header length out of range)")
        raw = f.read(length)
    try:
        header = json.loads(raw)
    except ValueError as e:
        raise ValueError(f"unreadable safetensors header: {e}") from None
    if not isinstance(header, dict):
        raise ValueError("unreadable safetensors header")
    end = total = 0
    for name, entry in header.items():
        if name == "__metadata__":
            continue
        start, stop = entry["data_offsets"]
        total += stop - start
        end = max(end, stop)
    if file.stat().st_size < 8 + length + end:
        raise ValueError(
            f"truncated: {file.stat().st_size} bytes, the header declares {8 + length + end}"
        )
    return total


def _check_architecture(m: Inspected, found: Findings) -> None:
    config, setting = m.config, m.setting
    model_type = config["model_type"]
    if config.get("model_file"):
        found.problem(
            "custom_code",
            f"{m.name} needs its own code ({config['model_file']}); the "
            "lanes do not run model code from model directories",
            setting,
        )
        return
    keys = [k for k in MULTIMODAL_KEYS if k in config]
    if model_type in MULTIMODAL_MODEL_TYPES or keys:
        why = f"config.json has {', '.join(keys)}" if keys else f"model_type {model_type}"
        found.problem(
            "multimodal",
            f"{m.name} is a multimodal model ({why}); the lanes speculate on text-only models",
            setting,
        )
        return
    try:
        arch = importlib.import_module(f"mlx_lm.models.{_mlx_model_type(config)}")
    except ImportError:
        found.problem(
            "architecture_unsupported",
            f"mlx-lm {_mlx_lm_version()} has no model type '{model_type}' ({m.name})",
            setting,
        )
        return
    try:
        from mlx_lm.models.cache import make_prompt_cache

        model = arch.Model(arch.ModelArgs.from_dict(config))  # lazy arrays: nothing allocated
        caches = make_prompt_cache(model)
    except Exception as e:
        found.problem(
            "config_invalid",
            f"mlx-lm cannot build {m.name} from its config.json: {type(e).__name__}: {e}",
            setting,
        )
        return
    stuck = sorted({type(c).__name__ for c in caches if not c.is_trimmable()})
    if stuck:
        found.problem(
            "cache_not_trimmable",
            f"{m.name} ({model_type}) keeps a recurrent state "
            f"({', '.join(stuck)}) that cannot rewind rejected draft tokens; mlx-lm "
            "cannot speculate with it",
            setting,
        )
    elif any(type(c).__name__ == "RotatingKVCache" for c in caches):
        found.warning(
            "sliding_window_cache",
            f"{m.name} ({model_type}) uses a sliding-window "
            "cache: rejected draft tokens can be rewound only while the context fits "
            "the window",
            setting,
        )


def _mlx_model_type(config: dict[str, Any]) -> str:
    """mlx-lm's remapping of model_type (``mistral`` is ``llama``, ...)."""
    from mlx_lm import utils

    model_type = config["model_type"]
    architectures = config.get("architectures") or ()
    if isinstance(architectures, str):
        architectures = (architectures,)
    by_arch = getattr(utils, "MODEL_ARCHITECTURE_REMAPPING", {})
    for architecture in architectures:
        if (model_type, architecture) in by_arch:
            return str(by_arch[(model_type, architecture)])
    return str(getattr(utils, "MODEL_REMAPPING", {}).get(model_type, model_type))


def _mlx_lm_version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("mlx-lm")
    except PackageNotFoundError:
        return "(unknown version)"


def _load_tokenizer(m: Inspected, found: Findings) -> Any:
    assert m.path is not None
    try:
        from mlx_lm.utils import load_tokenizer

        return load_tokenizer(m.path, eos_token_ids=m.config.get("eos_token_id"))
    except Exception as e:
        found.problem(
            "tokenizer_unloadable",
            f"the tokenizer of {m.name} does not load: {type(e).__name__}: {e}",
            m.setting,
        )
        return None
