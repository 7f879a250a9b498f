"""The ground floor of configuration: the one frozen base model and the one way a
validation error is worded (file or source, dotted key, message) for settings and policies."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, ValidationError


class Frozen(BaseModel):
    """Immutable, and a key that is not a field is an error (typos never pass silently)."""

    model_config = ConfigDict(frozen=True, extra="forbid")


def validation_problems(where: str, err: ValidationError) -> list[str]:
    """One line per problem: ``<where>: <dotted.key>: <message>``."""
    problems = []
    for item in err.errors():
        key = ".".join(str(p) for p in item["loc"]) or "(top level)"
        message = item["msg"].removeprefix("Value error, ")
        problems.append(f"{where}: {key}: {message}")
    return problems


def format_validation_error(where: str, err: ValidationError) -> str:
    return "\n".join(validation_problems(where, err))
