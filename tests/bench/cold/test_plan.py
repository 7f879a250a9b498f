"""``speclane bench cold``'s plan: the interleaved rounds, the prompts and the router's
configuration in each mode (pure, no model)."""

from __future__ import annotations

import tomllib
from pathlib import Path

import pytest

from router.bench.cold.plan import (
    COLD,
    LOADED,
    MLX_LM,
    SPECLANE,
    body,
    model_links,
    schedule,
    served_name,
    speclane_config,
)
from router.config.settings import LanesSettings


def test_the_side_measured_first_turns_each_round() -> None:
    assert schedule(3) == [
        (1, SPECLANE),
        (1, MLX_LM),
        (2, MLX_LM),
        (2, SPECLANE),
        (3, SPECLANE),
        (3, MLX_LM),
    ]


def test_each_request_asks_something_else() -> None:
    prompts = {body("m", i, 8)["messages"][0]["content"] for i in range(5)}
    assert len(prompts) == 5
    assert body("m", 0, 8) | {"messages": None} == {
        "model": "m",
        "messages": None,
        "max_tokens": 8,
        "temperature": 0,
        "stream": True,
    }


def test_the_model_is_linked_file_by_file_under_two_names(tmp_path: Path) -> None:
    model = Path("/models/SmolLM2")
    links = model_links(model, ["model.safetensors", "config.json"], tmp_path)
    assert links == [
        (tmp_path / LOADED / "config.json", model / "config.json"),
        (tmp_path / LOADED / "model.safetensors", model / "model.safetensors"),
        (tmp_path / COLD / "config.json", model / "config.json"),
        (tmp_path / COLD / "model.safetensors", model / "model.safetensors"),
    ]


def lanes_table(config: str) -> dict[str, object]:
    lanes = tomllib.loads(config)["lanes"]
    assert isinstance(lanes, dict)
    return lanes


def test_startup_mode_runs_the_model_itself_without_a_models_folder() -> None:
    model, policies = Path("/m/SmolLM2-135M-Instruct"), Path("/tmp/p")
    config = speclane_config("startup", model, policies, None, "auto")
    data = tomllib.loads(config)
    assert data["policies_dir"] == "/tmp/p"
    assert lanes_table(config) == {"model": str(model), "layout": "auto"}
    assert served_name("startup", model) == "SmolLM2-135M-Instruct"
    # what today's router accepts: every key is a setting of [lanes]
    assert set(lanes_table(config)) <= set(LanesSettings.model_fields)


def test_on_demand_mode_starts_on_the_first_name_of_the_models_folder() -> None:
    folder = Path("/tmp/models")
    config = speclane_config("on-demand", Path("/m/x"), Path("/tmp/p"), folder, "shared")
    assert lanes_table(config) == {
        "model": str(folder / LOADED),
        "layout": "shared",
        "models_dir": str(folder),
    }
    assert served_name("on-demand", Path("/m/x")) == LOADED
    with pytest.raises(ValueError, match="models_dir"):
        speclane_config("on-demand", Path("/m/x"), Path("/tmp/p"), None, "auto")
