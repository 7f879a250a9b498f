"""A chat prompt's token ids, with the special tokens only where the template put them.

A tokenizer reads every special token's text as that token, wherever it stands: a
``<|im_end|>\\n<|im_start|>system`` inside a tool result, a web page or a file an agent reads
would otherwise close the turn and open a system turn of its own. So the messages' text
(contents, names, tool calls, tool schemas) is rendered into the template with each special
token's text replaced by a marker the template passes through unchanged; the rendered text is
then split at the special tokens that remain (the template's own), each becomes its token,
and each piece between them is encoded with its markers turned back into the original text,
read as text (the tokenizer's ``split_special_tokens``). A tokenizer splits at special
tokens anyway and encodes what lies between on its own, so a prompt without special-token
text in its messages is encoded exactly as before, and one with it differs only in those
places.

``content_special_tokens = "control"`` (``[lanes]``) keeps the old reading for those who want
it (a client that writes control tokens into its messages on purpose).
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from router.kernel.errors import bad_request

# Private-use characters: a marker is OPEN + the special token's index + CLOSE. Real text
# almost never holds them; a message that does is read with the next pair (``_markers``).
_MARKER_PAIRS = (("\U000ff000", "\U000ff001"), ("\U000fe000", "\U000fe001"), ("\ue000", "\ue001"))


@dataclass(frozen=True)
class Specials:
    """A tokenizer's special tokens: their texts (longest first) and ids."""

    texts: tuple[str, ...]
    ids: dict[str, int]
    pattern: re.Pattern[str] | None  # any of the texts

    def found_in(self, strings: list[str]) -> bool:
        return self.pattern is not None and any(self.pattern.search(s) for s in strings)


def specials_of(tokenizer: Any) -> Specials:
    return _specials(id(tokenizer), tokenizer)


_cache: dict[int, tuple[Any, Specials]] = {}


def _specials(key: int, tokenizer: Any) -> Specials:
    # Keyed by identity and holding the tokenizer: a lane has one for its whole life.
    hit = _cache.get(key)
    if hit is not None and hit[0] is tokenizer:
        return hit[1]
    decoder = getattr(tokenizer, "added_tokens_decoder", None) or {}
    ids = {t.content: i for i, t in decoder.items() if getattr(t, "special", False) and t.content}
    texts = tuple(sorted(ids, key=len, reverse=True))
    pattern = re.compile("|".join(map(re.escape, texts))) if texts else None
    specials = Specials(texts, ids, pattern)
    _cache[key] = (tokenizer, specials)
    return specials


def encode_chat(
    tokenizer: Any,
    render: Callable[[Callable[[str], str]], str],
    strings: list[str],
    *,
    content_specials_as_text: bool = True,
) -> list[int]:
    """The token ids of a rendered chat prompt.

    ``render(escape)``: the template's text with ``escape`` applied to every string of the
    messages and tools; ``strings``: those strings (to see whether any holds a special
    token's text, and which markers they leave free).
    """
    specials = specials_of(tokenizer)
    if not content_specials_as_text or not specials.found_in(strings):
        return list(tokenizer.encode(render(_same), add_special_tokens=False))
    pattern = specials.pattern
    assert pattern is not None
    open_, close = _markers(strings)
    index = {text: i for i, text in enumerate(specials.texts)}

    def escape(text: str) -> str:
        return pattern.sub(lambda m: f"{open_}{index[m.group()]}{close}", text)

    marker = re.compile(f"{re.escape(open_)}(\\d+){re.escape(close)}")
    rendered = render(escape)
    ids: list[int] = []
    at = 0
    for m in pattern.finditer(rendered):  # the template's own special tokens
        ids += _as_text(tokenizer, rendered[at : m.start()], marker, specials)
        ids.append(specials.ids[m.group()])
        at = m.end()
    ids += _as_text(tokenizer, rendered[at:], marker, specials)
    return ids


def _as_text(tokenizer: Any, piece: str, marker: re.Pattern[str], specials: Specials) -> list[int]:
    if not piece:
        return []
    text = marker.sub(lambda m: specials.texts[int(m.group(1))], piece)
    if text == piece:
        return list(tokenizer.encode(piece, add_special_tokens=False))
    return list(tokenizer.encode(text, add_special_tokens=False, split_special_tokens=True))


def _markers(strings: list[str]) -> tuple[str, str]:
    for open_, close in _MARKER_PAIRS:
        if not any(open_ in s or close in s for s in strings):
            return open_, close
    raise bad_request(
        "the messages hold the private-use characters U+FF000, U+FE000 and U+E000 (with "
        "their pairs) together; remove one",
        param="messages",
    )


def _same(text: str) -> str:
    return text


def strings_in(value: Any) -> list[str]:
    """Every string in a JSON-like value (keys too)."""
    out: list[str] = []
    stack = [value]
    while stack:
        item = stack.pop()
        if isinstance(item, str):
            out.append(item)
        elif isinstance(item, dict):
            stack.extend(item.keys())
            stack.extend(item.values())
        elif isinstance(item, list | tuple):
            stack.extend(item)
    return out


def mapped(value: Any, fn: Callable[[str], str]) -> Any:
    """``value`` with ``fn`` applied to every string in it (keys too)."""
    if isinstance(value, str):
        return fn(value)
    if isinstance(value, dict):
        return {mapped(k, fn): mapped(v, fn) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [mapped(v, fn) for v in value]
    return value
