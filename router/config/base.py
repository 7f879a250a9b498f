"""The ground floor of configuration: the one frozen base model and the one way a
validation error is worded (file or source, dotted key, message) for settings and policies."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, ValidationError

from router.config.suggest import did_you_mean


class Frozen(BaseModel):
    """Immutable, and a key that is not a field is an error (typos never pass silently)."""

    model_config = ConfigDict(frozen=True, extra="forbid")


def validation_problems(
    where: str, err: ValidationError, model: type[BaseModel] | None = None
) -> list[str]:
    """One line per problem: ``<where>: <dotted.key>: <message>``, and for a key that is
    not a field of ``model``, the nearest one that is ("did you mean ...")."""
    problems = []
    for item in err.errors():
        key = ".".join(str(p) for p in item["loc"]) or "(top level)"
        message = item["msg"].removeprefix("Value error, ")
        hint = did_you_mean(model, dict(item)) if model is not None else ""
        problems.append(f"{where}: {key}: {message}{hint}")
    return problems


def format_validation_error(
    where: str, err: ValidationError, model: type[BaseModel] | None = None
) -> str:
    return "\n".join(validation_problems(where, err, model))
