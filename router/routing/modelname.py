"""What model a request's ``model`` names, for a client (pure): the one resolver of names,
aliases and ``model@preset`` suffixes, for routing (``router.routing.classify``) and for
models loaded on demand (``router.proxy.ondemand``) alike.

A client's alias maps a name it sends to a model's; ``known`` says which model a name is
(a served model's own name, or a loadable model's canonical one), or None. A name that is
not known as it stands may be ``base@preset``: the base (itself an alias or a model) and the
preset that the suffix names.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping


def resolve_name(
    requested: str, aliases: Mapping[str, str], known: Callable[[str], str | None]
) -> tuple[str, str | None] | None:
    """(the model, the ``@preset`` suffix or None) that ``requested`` names, or None when it
    names no model ``known`` knows."""
    name = aliases.get(requested, requested)
    if (model := known(name)) is not None:
        return model, None
    base, at, suffix = name.rpartition("@")  # an alias may name a model@preset too
    if at and base and (model := known(aliases.get(base, base))) is not None:
        return model, suffix
    return None
