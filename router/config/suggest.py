""" "Did you mean" for configuration keys that do not exist (pure).

A typo such as ``max_concurency`` is an ``extra_forbidden`` error from pydantic; the model
the key was found in is reached by walking the error's location through the field types
(nested models, ``X | None``, ``dict[str, X]``, ``tuple[X, ...]``), and its field names are
the candidates.
"""

from __future__ import annotations

import difflib
import types
import typing
from collections.abc import Sequence
from typing import Any

from pydantic import BaseModel


def _step(ann: Any, part: str | int) -> Any:
    """The annotation one location part below ``ann``, or None when it cannot be followed."""
    if isinstance(ann, type) and issubclass(ann, BaseModel):
        field = ann.model_fields.get(str(part))
        if field is None:
            field = next((f for f in ann.model_fields.values() if f.alias == part), None)
        return None if field is None else field.annotation
    origin, args = typing.get_origin(ann), typing.get_args(ann)
    if origin is typing.Annotated:
        return _step(args[0], part)
    if origin in (typing.Union, types.UnionType):
        for arg in args:
            if arg is not type(None) and (found := _step(arg, part)) is not None:
                return found
        return None
    if origin is dict or origin is typing.Mapping:
        return args[1] if len(args) == 2 else None
    if origin in (list, tuple, Sequence, frozenset, set):
        return args[0] if args else None
    return None


def _model_of(ann: Any) -> type[BaseModel] | None:
    if isinstance(ann, type) and issubclass(ann, BaseModel):
        return ann
    for arg in typing.get_args(ann):
        if (model := _model_of(arg)) is not None:
            return model
    return None


def keys_at(model: type[BaseModel], loc: Sequence[str | int]) -> list[str]:
    """The field names (and aliases) of the model that holds the key at ``loc``."""
    ann: Any = model
    for part in loc[:-1]:
        ann = _step(ann, part)
        if ann is None:
            return []
    holder = _model_of(ann)
    if holder is None:
        return []
    names = list(holder.model_fields)
    names += [f.alias for f in holder.model_fields.values() if f.alias]
    return names


def did_you_mean(model: type[BaseModel], error: dict[str, Any]) -> str:
    """ " (did you mean 'x'?)" for an unknown key close to a real one, else ""."""
    loc = error.get("loc") or ()
    if error.get("type") != "extra_forbidden" or not loc or not isinstance(loc[-1], str):
        return ""
    close = difflib.get_close_matches(loc[-1], keys_at(model, loc), n=1, cutoff=0.6)
    return f" (did you mean '{close[0]}'?)" if close else ""
