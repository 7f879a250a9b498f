"""What ``check_pair`` finds about a draft/target pair: problems (speculation would crash or
propose tokens the target reads as something else) and warnings (it works, but may not pay).
Each finding names the setting to change."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

# Findings of check_pair. Problems block speculation; warnings never do.
ProblemCode = Literal[
    "no_draft",  # speculation requested, no draft model configured
    "model_not_found",  # not a directory, not in the Hugging Face cache
    "config_invalid",  # config.json missing, unreadable, or mlx-lm cannot build the model
    "weights_missing",  # no model*.safetensors
    "weights_invalid",  # a safetensors header that does not parse, or a truncated file
    "tokenizer_unloadable",
    "architecture_unsupported",  # mlx-lm has no such model type
    "custom_code",  # config.json names a model_file: mlx-lm runs it only with trust_remote_code
    "multimodal",  # vision/audio models: the lanes serve text only
    "cache_not_trimmable",  # recurrent/SSM caches cannot rewind rejected draft tokens
    "vocab_size_mismatch",
    "vocab_mismatch",  # same size, different token -> id mapping
    "special_token_mismatch",  # bos/eos or a chat-template token has another id
    "chat_template_mismatch",  # the two templates render a conversation to other token ids
]
WarningCode = Literal[
    "draft_not_smaller",  # the draft's weights are not smaller: it cannot pay
    "embedding_size_differs",  # same tokenizer, padded embeddings of other sizes
    "pad_token_differs",  # never enters generation
    "chat_template_missing",
    "chat_template_unrenderable",
    "sliding_window_cache",  # rewinds only while the context fits the window
]
# Why a decision keeps speculation off, beyond the report's problem codes. below_floor: the pair's
# measured acceptance is under the floor (blocks in strict mode only; a warning otherwise).
DecisionCode = Literal["denied", "below_floor", "not_validated"]

TARGET_SETTING = "lanes.model"
DRAFT_SETTING = "lanes.draft_model"


@dataclass(frozen=True)
class Finding:
    code: ProblemCode | WarningCode
    message: str
    setting: str  # the configuration key to change, e.g. lanes.draft_model

    def line(self) -> str:
        return f"{self.code}: {self.message} (change {self.setting})"


@dataclass(frozen=True)
class ModelFacts:
    """What the checks read about one model directory (for messages and status)."""

    path: str
    model_type: str | None = None
    weight_bytes: int | None = None  # sum of tensor sizes from the safetensors headers
    tokenizer_size: int | None = None  # len(tokenizer), added tokens included
    config_vocab_size: int | None = None  # embedding rows, often padded past the tokenizer


@dataclass(frozen=True)
class PairReport:
    target: str
    draft: str | None
    problems: tuple[Finding, ...] = ()
    warnings: tuple[Finding, ...] = ()
    target_facts: ModelFacts | None = None
    draft_facts: ModelFacts | None = None

    @property
    def ok(self) -> bool:
        return not self.problems

    def summary(self) -> str:
        """One line: the problems, or "ok" (with the warnings' codes)."""
        if self.problems:
            return "; ".join(p.line() for p in self.problems)
        if self.warnings:
            return "ok, warnings: " + ", ".join(w.code for w in self.warnings)
        return "ok"
