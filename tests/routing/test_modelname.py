"""router.routing.modelname: one resolver of names, aliases and ``model@preset``."""

from __future__ import annotations

import pytest

from router.routing.modelname import resolve_name

MODELS = {"qwen": "Qwen3-8B", "Qwen3-8B": "Qwen3-8B"}  # a name -> the model it is


def known(name: str) -> str | None:
    return MODELS.get(name)


@pytest.mark.parametrize(
    ("requested", "want"),
    [
        ("Qwen3-8B", ("Qwen3-8B", None)),
        ("qwen", ("Qwen3-8B", None)),  # known under another name (a loadable model's)
        ("fast", ("Qwen3-8B", None)),  # the client's alias
        ("Qwen3-8B@interactive", ("Qwen3-8B", "interactive")),
        ("fast@batch", ("Qwen3-8B", "batch")),  # an alias with a preset
        ("pinned", ("Qwen3-8B", "interactive")),  # an alias naming a model@preset
        ("other", None),
        ("other@batch", None),
        ("@batch", None),
    ],
)
def test_resolve_name(requested: str, want: tuple[str, str | None] | None) -> None:
    aliases = {"fast": "qwen", "pinned": "Qwen3-8B@interactive"}
    assert resolve_name(requested, aliases, known) == want
