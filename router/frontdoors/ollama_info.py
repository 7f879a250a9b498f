"""The bodies of Ollama's model endpoints: /api/tags, /api/show, /api/ps, /api/version,
/api/pull (pure).

A model of speclane's lanes has its weights files' size; an external backend's model has
size 0. The digest is the SHA-256 of the model's name: stable, and distinct per model, which
is what clients use it for. ``/api/tags`` lists every model a request may name (a model of
ours that is not loaded loads on its first request); ``/api/ps`` the loaded ones, with when
each would be unloaded.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import Any

# The Ollama version speclane answers like. Clients compare it to gate features (tools,
# structured outputs; Codex --oss requires 0.13.4, the first Ollama whose /v1/responses it
# accepts): it names the API level implemented here, not speclane's version.
OLLAMA_VERSION = "0.13.4"
# /api/ps: the lanes stay loaded; Ollama reports when a model would be unloaded.
NEVER_EXPIRES = "2999-01-01T00:00:00Z"


@dataclass(frozen=True, slots=True)
class ServedModel:
    name: str
    format: str  # "mlx" for the lanes, else the backend kind
    ready: bool
    size: int = 0  # bytes of its weights (0: not known)
    loadable: bool = False  # one of ours, not loaded: listed by /api/tags, not /api/ps
    expires_at: str = NEVER_EXPIRES  # /api/ps: when it would be unloaded
    context_length: int | None = None  # as its lanes report it (None: not known)
    architecture: str | None = None  # its config's model_type, Ollama's general.architecture


def digest(name: str) -> str:
    return hashlib.sha256(name.encode()).hexdigest()


def details(model: ServedModel) -> dict[str, Any]:
    return {
        "parent_model": "",
        "format": model.format,
        "family": "",
        "families": None,
        "parameter_size": "",
        "quantization_level": "",
    }


def tags(models: list[ServedModel], modified_at: str) -> dict[str, Any]:
    return {
        "models": [
            {
                "name": m.name,
                "model": m.name,
                "modified_at": modified_at,
                "size": m.size,
                "digest": digest(m.name),
                "details": details(m),
            }
            for m in models
            if m.ready or m.loadable
        ]
    }


def ps(models: list[ServedModel]) -> dict[str, Any]:
    return {
        "models": [
            {
                "name": m.name,
                "model": m.name,
                "size": m.size,
                "digest": digest(m.name),
                "details": details(m),
                "expires_at": m.expires_at,
                "size_vram": 0,
                **({"context_length": m.context_length} if m.context_length else {}),
            }
            for m in models
            if m.ready
        ]
    }


def show(model: ServedModel, modified_at: str) -> dict[str, Any]:
    return {
        "modelfile": "",
        "parameters": "",
        "template": "",
        "details": details(model),
        "model_info": model_info(model),
        "capabilities": ["completion", "tools"],
        "modified_at": modified_at,
    }


def model_info(model: ServedModel) -> dict[str, Any]:
    """What Ollama's clients read of ``model_info``: ``general.architecture`` and
    ``<architecture>.context_length`` (Continue, Open WebUI size their prompts by it)."""
    if model.context_length is None:
        return {}
    arch = model.architecture or "speclane"
    return {"general.architecture": arch, f"{arch}.context_length": model.context_length}


def version() -> dict[str, Any]:
    return {"version": OLLAMA_VERSION}


def pull(name: str, served: list[ServedModel]) -> dict[str, Any]:
    """/api/pull's last line: speclane downloads nothing, so a model it serves is "pulled"
    already (``codex --oss`` pulls its model when the list lacks it) and any other is an
    error saying what is served."""
    if any(m.name == name and (m.ready or m.loadable) for m in served):
        return {"status": "success"}
    names = ", ".join(m.name for m in served) or "none"
    return {
        "error": f"speclane does not download models: '{name}' is not served here "
        f"(served: {names}); configure a lane model or a backend that serves it"
    }
