"""Configuration of the speculative auto-disable (``[spec]`` in speclane.toml, and the
per-policy ``[spec]`` overrides)."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict


class SpecSettings(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class SpecOverrides(BaseModel):
    """Per-policy overrides of SpecSettings: every field optional (None = inherit)."""

    model_config = ConfigDict(frozen=True, extra="forbid")
