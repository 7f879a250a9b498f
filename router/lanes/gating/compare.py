"""The pair half of ``check_pair``: two inspected models compared token by token.

Vocabulary (size and token -> id), the special tokens a chat template writes (and the bos/eos
ids), the chat templates themselves (identical, or rendering a sample conversation to the same
token ids) and the weights' sizes. mlx-lm feeds the draft the target's token ids, so any
difference here means the draft guesses in another language than the one it is checked in.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from router.lanes.gating.findings import (
    DRAFT_SETTING,
    TARGET_SETTING,
    Finding,
    ProblemCode,
    WarningCode,
)

# A conversation both chat templates must render to the same tokens.
SAMPLE_CONVERSATION = (
    {"role": "system", "content": "You are a concise assistant."},
    {"role": "user", "content": "What is the capital of France?"},
    {"role": "assistant", "content": "Paris."},
    {"role": "user", "content": "And of Italy? Answer in one word."},
)
_TEMPLATE_TOKEN = re.compile(r"<\|[^<>|\s]{1,80}\|>")


@dataclass
class Inspected:
    """One model directory as far as the checks got (a field stays empty after a problem)."""

    name: str
    setting: str
    path: Path | None = None
    config: dict[str, Any] = field(default_factory=dict)
    weight_bytes: int | None = None
    tokenizer: Any = None
    _vocab: dict[str, int] | None = field(default=None, repr=False)

    @property
    def vocab(self) -> dict[str, int]:
        """The tokenizer's token -> id, built once (``get_vocab`` builds the whole dict anew on
        every call, and the checks read it several times)."""
        if self._vocab is None:
            self._vocab = self.tokenizer.get_vocab()
        return self._vocab


class Findings:
    """Problems and warnings, collected in the order the checks ran."""

    def __init__(self) -> None:
        self.problems: list[Finding] = []
        self.warnings: list[Finding] = []

    def problem(self, code: ProblemCode, message: str, setting: str) -> None:
        self.problems.append(Finding(code, message, setting))

    def warning(self, code: WarningCode, message: str, setting: str) -> None:
        self.warnings.append(Finding(code, message, setting))


def compare_pair(t: Inspected, d: Inspected, found: Findings) -> None:
    if t.tokenizer is not None and d.tokenizer is not None:
        _compare_vocabularies(t, d, found)
        _compare_special_tokens(t, d, found)
        _compare_chat_templates(t, d, found)
    _compare_sizes(t, d, found)


def _compare_vocabularies(t: Inspected, d: Inspected, found: Findings) -> None:
    tv, dv = t.vocab, d.vocab
    if len(tv) != len(dv):
        found.problem(
            "vocab_size_mismatch",
            f"the draft's tokenizer has {len(dv)} tokens, the "
            f"target's {len(tv)}: they do not share a vocabulary",
            DRAFT_SETTING,
        )
    elif tv != dv:
        moved = sorted(tok for tok, i in tv.items() if dv.get(tok) != i)
        example = moved[0]
        found.problem(
            "vocab_mismatch",
            f"{len(moved)} tokens have other ids in the draft's "
            f"vocabulary (e.g. {example!r}: target {tv[example]}, draft "
            f"{dv.get(example)})",
            DRAFT_SETTING,
        )
    t_rows, d_rows = t.config.get("vocab_size"), d.config.get("vocab_size")
    if isinstance(t_rows, int) and isinstance(d_rows, int) and t_rows != d_rows:
        extra = (
            " (the draft may propose ids the target has no embedding for)"
            if d_rows > t_rows
            else ""
        )
        found.warning(
            "embedding_size_differs",
            f"embedding sizes differ: target {t_rows}, draft {d_rows}{extra}",
            DRAFT_SETTING,
        )


def _compare_special_tokens(t: Inspected, d: Inspected, found: Findings) -> None:
    wrong = []
    for role in ("bos", "eos"):
        ti, di = _role_id(t.tokenizer, role), _role_id(d.tokenizer, role)
        if ti is not None and di is not None and ti != di:
            wrong.append(
                f"{role} token: target {_token(t.tokenizer, role)} ({ti}), draft "
                f"{_token(d.tokenizer, role)} ({di})"
            )
    tv, dv = t.vocab, d.vocab
    for token in sorted(_template_tokens(t.tokenizer) | _template_tokens(d.tokenizer)):
        if tv.get(token) != dv.get(token):
            wrong.append(f"{token}: target {tv.get(token)}, draft {dv.get(token)}")
    if wrong:
        found.problem(
            "special_token_mismatch", "special tokens differ: " + "; ".join(wrong), DRAFT_SETTING
        )
    ti, di = _role_id(t.tokenizer, "pad"), _role_id(d.tokenizer, "pad")
    if ti is not None and di is not None and ti != di:
        found.warning(
            "pad_token_differs", f"pad token ids differ: target {ti}, draft {di}", DRAFT_SETTING
        )


def _role_id(tokenizer: Any, role: str) -> int | None:
    value = getattr(tokenizer, f"{role}_token_id", None)
    return value if isinstance(value, int) else None


def _token(tokenizer: Any, role: str) -> str:
    return repr(getattr(tokenizer, f"{role}_token", None))


def _template_text(tokenizer: Any) -> str:
    template = getattr(tokenizer, "chat_template", None)
    if isinstance(template, dict):  # named templates: check them all
        return "\n".join(str(v) for v in template.values())
    return template if isinstance(template, str) else ""


def _template_tokens(tokenizer: Any) -> set[str]:
    """The special tokens a chat template writes: ``<|...|>`` markers and any special or
    added token of the tokenizer that occurs in the template's source."""
    text = _template_text(tokenizer)
    if not text:
        return set()
    specials = set(getattr(tokenizer, "all_special_tokens", ()) or ())
    specials |= set(tokenizer.get_added_vocab())
    return set(_TEMPLATE_TOKEN.findall(text)) | {s for s in specials if s and s in text}


def _compare_chat_templates(t: Inspected, d: Inspected, found: Findings) -> None:
    t_has, d_has = t.tokenizer.has_chat_template, d.tokenizer.has_chat_template
    if not t_has:
        found.warning(
            "chat_template_missing",
            f"the target {t.name} has no chat template: chat requests cannot be formatted",
            TARGET_SETTING,
        )
        return
    if not d_has:
        found.warning(
            "chat_template_missing",
            f"the draft {d.name} has no chat template: it "
            "will read prompts in the target's format, which pays only if it was "
            "trained on it",
            DRAFT_SETTING,
        )
        return
    t_text, d_text = _template_text(t.tokenizer), _template_text(d.tokenizer)
    if t_text and t_text == d_text:
        return
    t_ids, t_err = render_sample(t.tokenizer)
    d_ids, d_err = render_sample(d.tokenizer)
    if t_ids is None or d_ids is None:
        who, err = (t.name, t_err) if t_ids is None else (d.name, d_err)
        found.warning(
            "chat_template_unrenderable",
            f"the chat template of {who} does not render "
            f"a sample conversation ({err}); templates not compared",
            TARGET_SETTING if t_ids is None else DRAFT_SETTING,
        )
        return
    if t_ids != d_ids:
        at = next(
            (i for i, (a, b) in enumerate(zip(t_ids, d_ids, strict=False)) if a != b),
            min(len(t_ids), len(d_ids)),
        )
        found.problem(
            "chat_template_mismatch",
            "the chat templates render a conversation "
            f"differently (from token {at}: target "
            f"{_snippet(t.tokenizer, t_ids[at : at + 8])}, draft "
            f"{_snippet(d.tokenizer, d_ids[at : at + 8])})",
            DRAFT_SETTING,
        )


def render_sample(tokenizer: Any) -> tuple[list[int] | None, str | None]:
    """The sample conversation's token ids, or the error; a template that rejects a system
    message (some do) is tried again without it."""
    error = None
    for messages in (SAMPLE_CONVERSATION, SAMPLE_CONVERSATION[1:]):
        try:
            ids = tokenizer.apply_chat_template(list(messages), add_generation_prompt=True)
        except Exception as e:
            error = f"{type(e).__name__}: {e}"
            continue
        if isinstance(ids, dict) or hasattr(ids, "keys"):  # a BatchEncoding
            ids = ids["input_ids"]
        return [int(i) for i in ids], None
    return None, error


def _snippet(tokenizer: Any, ids: list[int]) -> str:
    if not ids:
        return "(end)"
    try:
        return repr(tokenizer.decode(ids))
    except Exception:
        return str(ids)


def _compare_sizes(t: Inspected, d: Inspected, found: Findings) -> None:
    if t.weight_bytes is None or d.weight_bytes is None:
        return
    same = t.path is not None and d.path is not None and t.path.resolve() == d.path.resolve()
    if same:
        found.warning(
            "draft_not_smaller",
            "the draft is the target itself: every token is computed twice, speculation cannot pay",
            DRAFT_SETTING,
        )
    elif d.weight_bytes >= t.weight_bytes:
        found.warning(
            "draft_not_smaller",
            f"the draft's weights ({_mb(d.weight_bytes)}) are not "
            f"smaller than the target's ({_mb(t.weight_bytes)}): speculation cannot pay",
            DRAFT_SETTING,
        )


def _mb(n: int) -> str:
    return f"{n / 1e6:.0f} MB"
