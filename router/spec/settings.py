"""Configuration of the speculative auto-disable (``[spec]`` in speclane.toml)."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict


class SpecSettings(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")
