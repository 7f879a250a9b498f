"""Pair checks on the real default model and draft, on copies of the draft with deliberately
broken tokenizers/configs, and the strict/graceful/allow/deny decisions."""

from __future__ import annotations

import json
import logging
import shutil
import struct
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, get_args

import pytest
from pydantic import ValidationError

from router.config.gating import SETTINGS_KEY, GatingSettings, PairRule
from router.lanes.gating import inspect as gating_inspect
from router.lanes.gating.compare import render_sample
from router.lanes.gating.decide import check_pair, decide, lane_mode, matching_rule, preset_mode
from router.lanes.gating.findings import Finding, PairReport, ProblemCode, WarningCode
from router.lanes.gating.inspect import safetensors_data_bytes
from router.lanes.modelprep import ensure_default_models

SMALL_FILES = ("config.json", "tokenizer.json", "tokenizer_config.json", "chat_template.jinja")


@pytest.fixture(scope="module")
def default_pair() -> tuple[Path, Path]:
    return ensure_default_models(quiet=True)


@pytest.fixture(scope="module", autouse=True)
def default_tokenizers_once(default_pair: tuple[Path, Path]) -> Iterator[None]:
    """``check_pair`` loads both tokenizers on every call (about 1 s each); these tests read
    the default pair's and never change them (a variant is a copy in a folder of its own),
    so each is loaded once per module and the variants' are loaded as ``check_pair`` does."""
    real = gating_inspect._load_tokenizer
    defaults = {p.resolve() for p in default_pair}
    loaded: dict[Path, Any] = {}

    def once(m: Any, found: Any) -> Any:
        where = m.path.resolve() if m.path is not None else None
        if where not in defaults:
            return real(m, found)
        if where not in loaded:
            loaded[where] = real(m, found)
        return loaded[where]

    patch = pytest.MonkeyPatch()
    patch.setattr(gating_inspect, "_load_tokenizer", once)
    yield
    patch.undo()


@pytest.fixture(scope="module")
def default_report(default_pair: tuple[Path, Path]) -> PairReport:
    return check_pair(*default_pair)


@pytest.fixture
def variant(default_pair: tuple[Path, Path], tmp_path: Path) -> Callable[..., Path]:
    """A copy of the default draft (weights symlinked, small files copied) to break."""

    def make(name: str = "draft-variant", source: Path | None = None) -> Path:
        src = source or default_pair[1]
        dest = tmp_path / name
        dest.mkdir()
        for file in SMALL_FILES:
            if (src / file).exists():
                shutil.copy(src / file, dest / file)
        (dest / "model.safetensors").symlink_to(src / "model.safetensors")
        return dest

    return make


def codes(findings: tuple[Finding, ...]) -> set[str]:
    vocabulary = set(get_args(ProblemCode)) | set(get_args(WarningCode))
    assert {f.code for f in findings} <= vocabulary  # the closed vocabulary holds
    return {f.code for f in findings}


def edit_json(path: Path, edit: Callable[[Any], None]) -> None:
    data = json.loads(path.read_text(encoding="utf-8"))
    edit(data)
    path.write_text(json.dumps(data), encoding="utf-8")


def problem(report: PairReport, code: str) -> Finding:
    return next(p for p in report.problems if p.code == code)


# --- the real default pair -----------------------------------------------------------------------


def test_default_pair_is_compatible(
    default_pair: tuple[Path, Path], default_report: PairReport
) -> None:
    target, draft = default_pair
    assert default_report.ok, default_report.summary()
    assert default_report.problems == ()
    config = json.loads((target / "config.json").read_text())
    t, d = default_report.target_facts, default_report.draft_facts
    assert t is not None and d is not None
    assert t.model_type == d.model_type == config["model_type"]
    assert t.config_vocab_size == config["vocab_size"]
    assert t.tokenizer_size == d.tokenizer_size
    for facts, path in ((t, target), (d, draft)):
        size = (path / "model.safetensors").stat().st_size
        assert facts.weight_bytes is not None and 0.9 * size < facts.weight_bytes < size
    # The draft is stored dequantized on the CPU (as large as the target), quantized on a GPU:
    # the warning must follow the files, whichever was prepared here.
    draft_larger = (draft / "model.safetensors").stat().st_size >= (
        target / "model.safetensors"
    ).stat().st_size
    assert ("draft_not_smaller" in codes(default_report.warnings)) == draft_larger


def test_swapped_pair_and_self_draft_warn_not_smaller(default_pair: tuple[Path, Path]) -> None:
    target, draft = default_pair
    swapped = check_pair(draft, target)
    assert swapped.ok and "draft_not_smaller" in codes(swapped.warnings)
    itself = check_pair(target, target)
    assert itself.ok
    warning = next(w for w in itself.warnings if w.code == "draft_not_smaller")
    assert "the target itself" in warning.message and warning.setting == "lanes.draft_model"


def test_sample_conversation_renders_with_special_tokens(default_pair: tuple[Path, Path]) -> None:
    from mlx_lm.utils import load_tokenizer

    tokenizer = load_tokenizer(default_pair[0])
    ids, error = render_sample(tokenizer)
    assert error is None and ids
    im_start = tokenizer.get_vocab()["<|im_start|>"]
    assert ids.count(im_start) == 5  # four messages and the generation prompt


# --- deliberately mismatched tokenizers ----------------------------------------------------------


def test_extra_token_is_a_vocab_size_mismatch(
    default_pair: tuple[Path, Path], variant: Callable[..., Path]
) -> None:
    draft = variant()

    def add_token(tok: dict[str, Any]) -> None:
        size = len(tok["model"]["vocab"])
        tok["added_tokens"].append(
            {
                "id": size,
                "content": "<|extra|>",
                "single_word": False,
                "lstrip": False,
                "rstrip": False,
                "normalized": False,
                "special": True,
            }
        )

    edit_json(draft / "tokenizer.json", add_token)
    report = check_pair(default_pair[0], draft)
    assert not report.ok
    found = problem(report, "vocab_size_mismatch")
    assert found.setting == "lanes.draft_model"
    assert str(report.target_facts.tokenizer_size + 1) in found.message  # type: ignore[union-attr]


def test_swapped_ordinary_tokens_are_a_vocab_mismatch(
    default_pair: tuple[Path, Path], variant: Callable[..., Path]
) -> None:
    draft = variant()

    def swap(tok: dict[str, Any]) -> None:
        vocab = tok["model"]["vocab"]
        vocab["the"], vocab["and"] = vocab["and"], vocab["the"]

    edit_json(draft / "tokenizer.json", swap)
    report = check_pair(default_pair[0], draft)
    assert codes(report.problems) == {"vocab_mismatch"}
    assert "2 tokens" in problem(report, "vocab_mismatch").message


def test_swapped_chat_tokens_are_a_special_token_mismatch(
    default_pair: tuple[Path, Path], variant: Callable[..., Path]
) -> None:
    draft = variant()

    def swap(tok: dict[str, Any]) -> None:
        ids = {}
        for entry in tok["added_tokens"]:
            if entry["content"] in ("<|im_start|>", "<|im_end|>"):
                ids[entry["content"]] = entry["id"]
        a, b = ids["<|im_start|>"], ids["<|im_end|>"]
        for entry in tok["added_tokens"]:
            if entry["content"] in ids:
                entry["id"] = b if entry["id"] == a else a
        vocab = tok["model"]["vocab"]
        vocab["<|im_start|>"], vocab["<|im_end|>"] = b, a

    edit_json(draft / "tokenizer.json", swap)
    report = check_pair(default_pair[0], draft)
    assert {"special_token_mismatch", "vocab_mismatch"} <= codes(report.problems)
    message = problem(report, "special_token_mismatch").message
    assert "<|im_start|>" in message and "<|im_end|>" in message


def test_other_eos_token_is_a_special_token_mismatch(
    default_pair: tuple[Path, Path], variant: Callable[..., Path]
) -> None:
    draft = variant()
    edit_json(draft / "tokenizer_config.json", lambda c: c.update(eos_token="<|endoftext|>"))
    report = check_pair(default_pair[0], draft)
    assert codes(report.problems) == {"special_token_mismatch"}  # same vocabulary
    assert "eos token" in problem(report, "special_token_mismatch").message


def test_tokenizer_built_in_the_test_mismatches(
    default_pair: tuple[Path, Path], variant: Callable[..., Path]
) -> None:
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    words = ["<unk>", "<s>", "</s>", "hello", "world", "paris", "?", "."]
    backend = Tokenizer(models.WordLevel({w: i for i, w in enumerate(words)}, unk_token="<unk>"))
    backend.pre_tokenizer = pre_tokenizers.Whitespace()
    draft = variant()
    for file in ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja"):
        (draft / file).unlink()
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=backend, bos_token="<s>", eos_token="</s>", unk_token="<unk>"
    )
    tokenizer.save_pretrained(str(draft))
    report = check_pair(default_pair[0], draft)
    assert {"vocab_size_mismatch", "special_token_mismatch"} <= codes(report.problems)
    assert "chat_template_missing" in codes(report.warnings)
    assert "8 tokens" in problem(report, "vocab_size_mismatch").message


def test_unloadable_tokenizer(
    default_pair: tuple[Path, Path], variant: Callable[..., Path]
) -> None:
    draft = variant()
    (draft / "tokenizer.json").write_text("{", encoding="utf-8")
    report = check_pair(default_pair[0], draft)
    assert problem(report, "tokenizer_unloadable").setting == "lanes.draft_model"


# --- chat templates ------------------------------------------------------------------------------


def test_other_chat_template_is_a_mismatch(
    default_pair: tuple[Path, Path], variant: Callable[..., Path]
) -> None:
    draft = variant()
    (draft / "chat_template.jinja").write_text(
        "{% for m in messages %}<|im_start|>{{ m['role'] }}: {{ m['content'] }}<|im_end|>"
        "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant: {% endif %}"
    )
    report = check_pair(default_pair[0], draft)
    assert codes(report.problems) == {"chat_template_mismatch"}
    assert problem(report, "chat_template_mismatch").setting == "lanes.draft_model"


def test_equivalent_chat_template_is_compatible(
    default_pair: tuple[Path, Path], variant: Callable[..., Path]
) -> None:
    draft = variant()
    template = (draft / "chat_template.jinja").read_text()
    (draft / "chat_template.jinja").write_text("{# same output, other source #}" + template)
    report = check_pair(default_pair[0], draft)
    assert report.ok, report.summary()


def test_draft_without_chat_template_warns(
    default_pair: tuple[Path, Path], variant: Callable[..., Path]
) -> None:
    draft = variant()
    (draft / "chat_template.jinja").unlink()
    report = check_pair(default_pair[0], draft)
    assert report.ok
    assert (
        next(w for w in report.warnings if w.code == "chat_template_missing").setting
        == "lanes.draft_model"
    )


# --- architectures and files ---------------------------------------------------------------------


def test_multimodal_configs_are_refused(
    default_pair: tuple[Path, Path], variant: Callable[..., Path]
) -> None:
    draft = variant("vlm-draft")
    edit_json(draft / "config.json", lambda c: c.update(vision_config={"hidden_size": 64}))
    report = check_pair(default_pair[0], draft)
    found = problem(report, "multimodal")
    assert "vision_config" in found.message and found.setting == "lanes.draft_model"

    target = variant("vlm-target")
    edit_json(target / "config.json", lambda c: c.update(model_type="qwen2_vl"))
    report = check_pair(target, default_pair[1])
    found = problem(report, "multimodal")
    assert "qwen2_vl" in found.message and found.setting == "lanes.model"


def test_unknown_architecture_is_unsupported(
    default_pair: tuple[Path, Path], variant: Callable[..., Path]
) -> None:
    draft = variant()
    edit_json(draft / "config.json", lambda c: c.update(model_type="no_such_arch"))
    report = check_pair(default_pair[0], draft)
    assert "no_such_arch" in problem(report, "architecture_unsupported").message


def test_recurrent_cache_cannot_speculate(
    default_pair: tuple[Path, Path], variant: Callable[..., Path]
) -> None:
    draft = variant()
    mamba = {
        "model_type": "mamba",
        "vocab_size": 49152,
        "hidden_size": 64,
        "intermediate_size": 128,
        "state_size": 16,
        "num_hidden_layers": 2,
        "conv_kernel": 4,
        "use_bias": False,
        "use_conv_bias": True,
        "time_step_rank": 4,
    }
    (draft / "config.json").write_text(json.dumps(mamba))
    report = check_pair(default_pair[0], draft)
    assert "ArraysCache" in problem(report, "cache_not_trimmable").message


def test_sliding_window_cache_warns(
    default_pair: tuple[Path, Path], variant: Callable[..., Path]
) -> None:
    draft = variant()
    gemma = {
        "model_type": "gemma3_text",
        "hidden_size": 64,
        "num_hidden_layers": 2,
        "intermediate_size": 128,
        "num_attention_heads": 2,
        "num_key_value_heads": 1,
        "head_dim": 32,
        "vocab_size": 49152,
        "sliding_window": 16,
        "sliding_window_pattern": 2,
    }
    (draft / "config.json").write_text(json.dumps(gemma))
    report = check_pair(default_pair[0], draft)
    assert "sliding_window_cache" in codes(report.warnings)
    assert "cache_not_trimmable" not in codes(report.problems)


def test_bad_config_for_the_architecture(
    default_pair: tuple[Path, Path], variant: Callable[..., Path]
) -> None:
    draft = variant()
    edit_json(draft / "config.json", lambda c: c.pop("hidden_size"))
    report = check_pair(default_pair[0], draft)
    assert "mlx-lm cannot build" in problem(report, "config_invalid").message


def test_custom_model_code_is_refused(
    default_pair: tuple[Path, Path], variant: Callable[..., Path]
) -> None:
    draft = variant()
    edit_json(draft / "config.json", lambda c: c.update(model_file="modeling_x.py"))
    assert "modeling_x.py" in problem(check_pair(default_pair[0], draft), "custom_code").message


def test_missing_and_broken_files(
    default_pair: tuple[Path, Path], variant: Callable[..., Path], tmp_path: Path
) -> None:
    target = default_pair[0]
    report = check_pair(target, tmp_path / "absent")
    assert problem(report, "model_not_found").setting == "lanes.draft_model"
    assert "model_not_found" in codes(check_pair("nobody/no-such-model-xyz", target).problems)

    no_config = variant("no-config")
    (no_config / "config.json").unlink()
    assert "config_invalid" in codes(check_pair(target, no_config).problems)

    no_weights = variant("no-weights")
    (no_weights / "model.safetensors").unlink()
    (no_weights / "model.gguf").write_bytes(b"GGUF")
    found = problem(check_pair(target, no_weights), "weights_missing")
    assert "converted" in found.message

    truncated = variant("truncated")
    (truncated / "model.safetensors").unlink()
    header = json.dumps({"w": {"dtype": "F32", "shape": [4], "data_offsets": [0, 16]}}).encode()
    (truncated / "model.safetensors").write_bytes(struct.pack("<Q", len(header)) + header + b"x")
    assert "truncated" in problem(check_pair(target, truncated), "weights_invalid").message


def test_safetensors_bytes_from_the_header(tmp_path: Path) -> None:
    import mlx.core as mx

    file = tmp_path / "model.safetensors"
    mx.save_safetensors(str(file), {"a": mx.zeros((3, 5)), "b": mx.zeros((7,), dtype=mx.int8)})
    assert safetensors_data_bytes(file) == 3 * 5 * 4 + 7


def test_no_draft(default_pair: tuple[Path, Path]) -> None:
    report = check_pair(default_pair[0], None)
    assert codes(report.problems) == {"no_draft"} and report.draft is None


# --- configuration -------------------------------------------------------------------------------


def test_settings_are_frozen_and_closed() -> None:
    settings = GatingSettings()
    assert settings.mode == "graceful" and settings.acceptance_floor == 0.3
    with pytest.raises(ValidationError):
        GatingSettings(mode="lenient")  # type: ignore[arg-type]
    with pytest.raises(ValidationError):
        GatingSettings(unknown=1)  # type: ignore[call-arg]
    with pytest.raises(ValidationError):
        PairRule(target="a", draft="b", action="maybe")  # type: ignore[arg-type]
    with pytest.raises(ValidationError):
        settings.mode = "strict"  # type: ignore[misc]


def test_modes_per_lane_and_preset() -> None:
    s = GatingSettings(lane_modes={"speculative": "strict"}, preset_modes={"interactive": "strict"})
    assert lane_mode(s, "speculative") == "strict"
    assert lane_mode(s, "lmstudio") == "graceful"
    assert lane_mode(s, "lmstudio", presets=["interactive"]) == "strict"
    assert preset_mode(s, "interactive") == "strict" and preset_mode(s, "throughput") == "graceful"
    strict = GatingSettings(mode="strict", preset_modes={"throughput": "graceful"})
    # a graceful preset does not relax the lane: requests without a preset still expect strict
    assert lane_mode(strict, "speculative", presets=["throughput"]) == "strict"
    assert preset_mode(strict, "throughput") == "graceful" and preset_mode(strict, None) == "strict"


# --- decisions -----------------------------------------------------------------------------------

T, D = "/models/Qwen2.5-7B-Instruct", "/models/Qwen2.5-0.5B-Instruct"
VOCAB = Finding(
    "vocab_size_mismatch",
    "the draft's tokenizer has 10 tokens, the target's 20",
    "lanes.draft_model",
)
NOT_SMALLER = Finding("draft_not_smaller", "not smaller", "lanes.draft_model")
TEMPLATE = Finding("chat_template_missing", "no template", "lanes.draft_model")


def report(*findings: Finding) -> PairReport:
    problems = tuple(f for f in findings if f.code in ("vocab_size_mismatch", "multimodal"))
    warnings = tuple(f for f in findings if f not in problems)
    return PairReport(T, D, problems=problems, warnings=warnings)


def test_compatible_pair_is_active() -> None:
    d = decide(report(), GatingSettings(), T, D)
    assert d.active and not d.fatal and d.reason is None and d.mode == "graceful"


def test_graceful_problem_starts_without_speculation() -> None:
    d = decide(report(VOCAB), GatingSettings(), T, D)
    assert not d.active and not d.fatal and d.code == "vocab_size_mismatch"
    assert d.reason is not None and "lanes.draft_model" in d.reason and "10 tokens" in d.reason


def test_strict_problem_is_fatal_with_an_actionable_message() -> None:
    d = decide(report(VOCAB), GatingSettings(mode="strict"), T, D)
    assert not d.active and d.fatal and d.mode == "strict"
    assert "lanes.draft_model" in d.message and f'{SETTINGS_KEY}.mode = "graceful"' in d.message
    # per lane: another lane name does not inherit the speculative lane's strictness
    per_lane = GatingSettings(lane_modes={"speculative": "strict"})
    assert decide(report(VOCAB), per_lane, T, D).fatal
    assert not decide(report(VOCAB), per_lane, T, D, lane="other").fatal
    strict_preset = GatingSettings(preset_modes={"interactive": "strict"})
    assert decide(report(VOCAB), strict_preset, T, D, presets=["interactive"]).fatal


def test_deny_wins_over_allow() -> None:
    rules = (
        PairRule(target="Qwen2.5-7B*", draft="*", action="allow"),
        PairRule(
            target="Qwen2.5-7B-Instruct",
            draft="Qwen2.5-0.5B-Instruct",
            action="deny",
            note="diverges on tool calls",
        ),
    )
    graceful = decide(report(), GatingSettings(pairs=rules), T, D)
    assert not graceful.active and not graceful.fatal and graceful.code == "denied"
    assert graceful.reason is not None and "diverges on tool calls" in graceful.reason
    strict = decide(report(), GatingSettings(mode="strict", pairs=rules), T, D)
    assert strict.fatal and f"{SETTINGS_KEY}.pairs" in strict.message


def test_allow_silences_size_warning_but_not_problems() -> None:
    allow = GatingSettings(
        pairs=(PairRule(target="Qwen2.5-7B-Instruct", draft="Qwen2.5-0.5B-Instruct"),)
    )
    d = decide(report(NOT_SMALLER, TEMPLATE), allow, T, D)
    assert d.active and d.rule is not None
    assert [w.split(":")[0] for w in d.warnings] == ["chat_template_missing"]
    unlisted = decide(report(NOT_SMALLER), GatingSettings(), T, D)
    assert unlisted.active and unlisted.warnings[0].startswith("draft_not_smaller")
    blocked = decide(report(VOCAB), allow.model_copy(update={"mode": "strict"}), T, D)
    assert not blocked.active and blocked.fatal and blocked.code == "vocab_size_mismatch"


def test_acceptance_floor() -> None:
    low = PairRule(
        target="Qwen2.5-7B-Instruct", draft="Qwen2.5-0.5B-Instruct", measured_acceptance=0.12
    )
    strict = GatingSettings(mode="strict", pairs=(low,))
    d = decide(report(), strict, T, D)
    assert d.fatal and d.code == "below_floor" and "0.12" in d.message
    lenient = strict.model_copy(update={"deny_below_floor": False})
    d = decide(report(), lenient, T, D)
    assert d.active and any("below_floor" in w for w in d.warnings)
    graceful = decide(report(), GatingSettings(pairs=(low,)), T, D)
    assert graceful.active and any("below the floor 0.3" in w for w in graceful.warnings)
    failed = low.model_copy(update={"measured_acceptance": 0.9, "passed_floor": False})
    assert decide(report(), strict.model_copy(update={"pairs": (failed,)}), T, D).fatal
    good = low.model_copy(update={"measured_acceptance": 0.6})
    assert decide(report(), strict.model_copy(update={"pairs": (good,)}), T, D).active


def test_require_listed() -> None:
    settings = GatingSettings(require_listed=True)
    d = decide(report(), settings, T, D)
    assert not d.active and d.code == "not_validated"
    listed = settings.model_copy(
        update={"pairs": (PairRule(target="Qwen2.5-7B-Instruct", draft="Qwen2.5-0.5B-Instruct"),)}
    )
    assert decide(report(), listed, T, D).active


def test_rule_names_match_paths_repo_ids_and_patterns() -> None:
    rule = PairRule(target="Qwen2.5-7B-Instruct", draft="Qwen2.5-0.5B*")
    settings = GatingSettings(pairs=(rule,))
    assert matching_rule(settings, T, D) == rule
    assert (
        matching_rule(
            settings,
            "mlx-community/Qwen2.5-7B-Instruct",
            "mlx-community/Qwen2.5-0.5B-Instruct-4bit",
        )
        == rule
    )
    assert matching_rule(settings, "/models/Qwen2.5-7B-Instruct-4bit", D) is None
    assert matching_rule(settings, T, None) is None
    by_repo = PairRule(target="mlx-community/Qwen2.5-7B-Instruct", draft="*")
    assert (
        matching_rule(GatingSettings(pairs=(by_repo,)), "mlx-community/Qwen2.5-7B-Instruct", D)
        == by_repo
    )


async def test_a_chosen_draft_as_large_as_its_target_is_still_a_warning(
    default_pair: tuple[Path, Path], caplog: pytest.LogCaptureFixture
) -> None:
    """Only the shipped pair's ``draft_not_smaller`` is said at info (tests/test_server.py)."""
    from router.config.settings import load_settings
    from router.lanes.group import LaneModels, gate_speculation

    target, _ = default_pair
    caplog.set_level(logging.INFO, logger="speclane.lanes")
    chosen = LaneModels(str(target), str(target), "chosen")  # the target as its own draft
    assert (await gate_speculation(load_settings(None), chosen)).active
    (record,) = [r for r in caplog.records if "draft_not_smaller" in r.getMessage()]
    assert record.levelno == logging.WARNING
