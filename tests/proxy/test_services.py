"""router.proxy.services: the one typed object handed to every handler, and no app state keys."""

from __future__ import annotations

import ast
import dataclasses
from pathlib import Path

import pytest

from router.app import wire
from router.proxy.services import Started
from tests.conftest import router_settings

ROUTER = Path(__file__).resolve().parents[2] / "router"
# The lane worker is a program of its own with its own small app (router.worker.server).
OWN_APP = ROUTER / "worker"


def state_lookups(path: Path) -> list[str]:
    """``app[...]`` / ``request.app[...]`` subscripts, ``app.get(...)`` and ``AppKey(...)``."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Subscript):
            target = node.value
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
            target = node.func.value if node.func.attr == "get" else None
            if node.func.attr == "AppKey":
                found.append(f"{path.relative_to(ROUTER.parent)}:{node.lineno}")
                continue
        else:
            continue
        named_app = (isinstance(target, ast.Name) and target.id == "app") or (
            isinstance(target, ast.Attribute) and target.attr == "app"
        )
        if named_app:
            found.append(f"{path.relative_to(ROUTER.parent)}:{node.lineno}")
    return found


def test_the_router_looks_nothing_up_in_the_app() -> None:
    """Every handler gets its services handed in (``router.proxy.services.bind``); a lookup by
    key would be a hop no reader or type checker follows."""
    found = [
        hit
        for path in sorted(ROUTER.rglob("*.py"))
        if OWN_APP not in path.parents
        for hit in state_lookups(path)
    ]
    assert found == []


def test_the_services_are_built_once_and_frozen() -> None:
    app, services = wire(router_settings())
    with pytest.raises(dataclasses.FrozenInstanceError):
        services.pool = services.pool  # type: ignore[misc]
    assert services.relay is not None and services.started.models is None
    assert app.router.resources()  # the routes were registered with these services bound


def test_the_client_session_exists_only_once_started() -> None:
    with pytest.raises(RuntimeError, match="not started"):
        Started().client_session()
