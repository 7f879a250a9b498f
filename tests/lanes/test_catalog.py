"""The servable models of a models directory and [[lanes.models]] (router.lanes.catalog)."""

from __future__ import annotations

from pathlib import Path

import pytest

from router.config.settings import ModelEntry
from router.lanes.catalog import CatalogModel, Folder, build, from_entry, from_folders, list_dir


def folder(name: str, *, config: bool = True, weights: int = 100) -> Folder:
    return Folder(name, f"/m/{name}", config, weights)


def test_every_mlx_directory_is_a_model_under_its_folder_name() -> None:
    models = from_folders([folder("qwen"), folder("llama")])
    assert [(m.name, m.path, m.size_bytes) for m in models] == [
        ("llama", "/m/llama", 100),
        ("qwen", "/m/qwen", 100),
    ]


@pytest.mark.parametrize(
    "broken",
    [folder("x", config=False), folder("x", weights=0)],
    ids=["no-config", "no-weights"],
)
def test_a_folder_without_config_or_weights_is_not_a_model(broken: Folder) -> None:
    assert from_folders([broken, folder("ok")]) == [CatalogModel("ok", "/m/ok", size_bytes=100)]


def test_a_draft_folder_is_its_siblings_draft_not_a_model() -> None:
    models = from_folders([folder("qwen"), folder("qwen-draft")])
    assert [(m.name, m.draft) for m in models] == [("qwen", "/m/qwen-draft")]


def test_a_draft_folder_without_its_sibling_is_ignored() -> None:
    assert from_folders([folder("lonely-draft")]) == []


def test_an_unusable_draft_is_no_draft() -> None:
    models = from_folders([folder("qwen"), folder("qwen-draft", weights=0)])
    assert models[0].draft is None


def test_a_configured_entry_wins_over_a_folder_of_its_name() -> None:
    entry = from_entry(
        ModelEntry(name="qwen", path="/elsewhere/qwen", aliases=("q",), pinned=True, ttl=5),
        size_bytes=7,
    )
    catalog = build([folder("qwen"), folder("llama")], [entry])
    qwen = catalog.get("qwen")
    assert qwen is not None
    assert (qwen.path, qwen.aliases, qwen.is_pinned, qwen.ttl, qwen.origin) == (
        "/elsewhere/qwen",
        ("q",),
        True,
        5,
        "config",
    )
    assert catalog.names() == ["llama", "qwen"]


def test_the_startup_model_comes_first_and_is_pinned() -> None:
    startup = CatalogModel("main", "/cfg/main", "/cfg/main-draft", size_bytes=9)
    catalog = build([folder("main"), folder("other")], [], startup)
    first = catalog.models[0]
    assert catalog.names() == ["main", "other"]
    assert (first.path, first.draft, first.origin, first.is_pinned) == (
        "/cfg/main",
        "/cfg/main-draft",
        "startup",
        True,
    )
    assert not catalog.models[1].is_pinned


def test_an_entry_for_the_startup_model_may_unpin_it_and_add_aliases() -> None:
    startup = CatalogModel("main", "/cfg/main", size_bytes=9)
    entry = from_entry(ModelEntry(name="main", path="/x", aliases=("m",), pinned=False), 1)
    catalog = build([], [entry], startup)
    (main,) = catalog.models
    assert (main.path, main.aliases, main.is_pinned, main.origin) == (
        "/cfg/main",
        ("m",),
        False,
        "startup",
    )


def test_aliases_resolve_and_a_models_own_name_wins_over_an_alias() -> None:
    a = from_entry(ModelEntry(name="a", path="/a", aliases=("fast", "b")), 1)
    b = from_entry(ModelEntry(name="b", path="/b", aliases=("fast",)), 1)
    catalog = build([], [a, b])
    assert catalog.canonical("fast") == "a"  # the first entry (by name) keeps it
    assert catalog.canonical("b") == "b"  # a name is never an alias of another model
    assert catalog.get("a") is not None and catalog.get("a").aliases == ("fast",)  # type: ignore[union-attr]
    assert catalog.get("b").aliases == ()  # type: ignore[union-attr]
    assert catalog.canonical("unknown") is None


def test_list_dir_reads_config_and_weights(tmp_path: Path) -> None:
    good = tmp_path / "good"
    good.mkdir()
    (good / "config.json").write_text("{}")
    (good / "model.safetensors").write_bytes(b"x" * 10)
    (good / "tokenizer.json").write_text("{}")  # not weights
    (tmp_path / "empty").mkdir()
    (tmp_path / "file.txt").write_text("not a folder")
    linked = tmp_path / "linked"
    linked.symlink_to(good)
    folders = {f.name: f for f in list_dir(tmp_path)}
    assert sorted(folders) == ["empty", "good", "linked"]
    assert (folders["good"].has_config, folders["good"].weights_bytes) == (True, 10)
    assert (folders["linked"].has_config, folders["linked"].weights_bytes) == (True, 10)
    assert (folders["empty"].has_config, folders["empty"].weights_bytes) == (False, 0)
    assert list_dir(tmp_path / "missing") == []


def test_the_startup_folder_under_another_name_is_one_model(tmp_path: Path) -> None:
    from router.config.settings import Settings
    from router.lanes.group import LaneModels
    from router.lanes.models import catalog_for

    for name in ("SmolLM2", "other"):
        (tmp_path / name).mkdir()
        (tmp_path / name / "config.json").write_text("{}")
        (tmp_path / name / "model.safetensors").write_bytes(b"x")
    settings = Settings(lanes={"models_dir": str(tmp_path)})  # type: ignore[arg-type]
    startup = LaneModels(str(tmp_path / "SmolLM2"), None, "smol")  # model_name = "smol"
    assert catalog_for(settings, startup).names() == ["smol", "other"]
    same = LaneModels(str(tmp_path / "SmolLM2"), None, "SmolLM2")
    assert catalog_for(settings, same).names() == ["SmolLM2", "other"]
