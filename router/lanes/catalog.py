"""The models the lanes can serve: the start-up model, every mlx-lm directory of
``[lanes] models_dir`` and every ``[[lanes.models]]`` entry (``build`` is pure, given the
directory listing that ``list_dir`` reads).

Rules: a folder is a model when it holds ``config.json`` and at least one weights file; its
folder name is its id. A folder named ``<name>-draft`` is ``<name>``'s draft, never a model
of its own (with no ``<name>`` beside it, it is ignored). A ``[[lanes.models]]`` entry wins
over a folder of the same name; the start-up model wins over both (it keeps its path and
draft as configured; an entry of its name adds aliases, ``pinned``, ``ttl``, ``layout``).
The start-up model is pinned unless its entry says ``pinned = false``. An alias that is
already a model's name is ignored (the name wins).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from router.config.group import GroupSpec
from router.config.settings import ModelEntry
from router.lanes.memory import WEIGHT_SUFFIXES

DRAFT_SUFFIX = "-draft"
Origin = Literal["startup", "config", "dir"]


@dataclass(frozen=True, slots=True)
class Folder:
    """One entry of the models directory, as read from disk."""

    name: str
    path: str
    has_config: bool
    weights_bytes: int  # 0: no weights file


@dataclass(frozen=True, slots=True)
class CatalogModel:
    name: str
    path: str
    draft: str | None = None
    aliases: tuple[str, ...] = ()
    pinned: bool | None = None  # None: not said (the start-up model is pinned, others not)
    ttl: float | None = None  # None: [lanes] ttl
    layout: str | None = None  # None: [lanes] layout
    group: GroupSpec | None = None  # its lane spans a group of ranks ([lanes.models] group)
    size_bytes: int = 0  # the weights files on disk (0: unknown, e.g. a hub id)
    origin: Origin = "dir"

    @property
    def is_pinned(self) -> bool:
        return bool(self.pinned)


@dataclass(frozen=True, slots=True)
class Catalog:
    models: tuple[CatalogModel, ...]

    def names(self) -> list[str]:
        return [m.name for m in self.models]

    def get(self, name: str) -> CatalogModel | None:
        """The model called ``name`` or aliased so."""
        for m in self.models:
            if m.name == name:
                return m
        for m in self.models:
            if name in m.aliases:
                return m
        return None

    def canonical(self, name: str) -> str | None:
        model = self.get(name)
        return model.name if model is not None else None


def is_model(folder: Folder) -> bool:
    return folder.has_config and folder.weights_bytes > 0


def from_folders(folders: Iterable[Folder]) -> list[CatalogModel]:
    """The models of a directory listing, each with its ``-draft`` sibling, sorted by name."""
    usable = {f.name: f for f in folders if is_model(f)}
    models = []
    for name, folder in sorted(usable.items()):
        if name.endswith(DRAFT_SUFFIX):
            continue  # a draft, not a model of its own
        draft = usable.get(name + DRAFT_SUFFIX)
        models.append(
            CatalogModel(
                name=name,
                path=folder.path,
                draft=draft.path if draft is not None else None,
                size_bytes=folder.weights_bytes,
            )
        )
    return models


def from_entry(entry: ModelEntry, size_bytes: int) -> CatalogModel:
    return CatalogModel(
        name=entry.name,
        path=entry.path,
        draft=entry.draft,
        aliases=entry.aliases,
        pinned=entry.pinned,
        ttl=entry.ttl,
        layout=entry.layout,
        group=entry.group,
        size_bytes=size_bytes,
        origin="config",
    )


def build(
    folders: Iterable[Folder],
    entries: Sequence[CatalogModel] = (),
    startup: CatalogModel | None = None,
) -> Catalog:
    """Every servable model, the start-up model first, then by name."""
    by_name: dict[str, CatalogModel] = {m.name: m for m in from_folders(folders)}
    for entry in entries:
        by_name[entry.name] = entry
    if startup is not None:
        # A folder or entry naming the start-up model only adds what the start-up
        # configuration leaves open (aliases, pinned, ttl).
        known = by_name.pop(startup.name, None)
        said = known if known is not None and known.origin == "config" else startup
        startup = CatalogModel(
            name=startup.name,
            path=startup.path,
            draft=startup.draft,
            aliases=said.aliases,
            pinned=True if said.pinned is None else said.pinned,
            ttl=said.ttl,
            layout=said.layout,
            group=startup.group,
            size_bytes=startup.size_bytes,
            origin="startup",
        )
    ordered = ([startup] if startup is not None else []) + sorted(
        by_name.values(), key=lambda m: m.name
    )
    names = {m.name for m in ordered}
    seen: set[str] = set()
    cleaned = []
    for m in ordered:
        aliases = tuple(a for a in m.aliases if a not in names and a not in seen)
        seen.update(aliases)
        cleaned.append(m if aliases == m.aliases else _with_aliases(m, aliases))
    return Catalog(tuple(cleaned))


def _with_aliases(model: CatalogModel, aliases: tuple[str, ...]) -> CatalogModel:
    return CatalogModel(
        model.name,
        model.path,
        model.draft,
        aliases,
        model.pinned,
        model.ttl,
        model.layout,
        model.group,
        model.size_bytes,
        model.origin,
    )


def list_dir(directory: Path) -> list[Folder]:
    """The sub-directories of ``directory`` (none when it does not exist)."""
    try:
        children = sorted(p for p in directory.iterdir() if p.is_dir())
    except OSError:
        return []
    return [
        Folder(
            name=child.name,
            path=str(child),
            has_config=(child / "config.json").is_file(),
            weights_bytes=_weights(child),
        )
        for child in children
    ]


def _weights(path: Path) -> int:
    try:
        return sum(
            f.stat().st_size
            for f in path.iterdir()
            if f.is_file() and f.name.endswith(WEIGHT_SUFFIXES)
        )
    except OSError:
        return 0
