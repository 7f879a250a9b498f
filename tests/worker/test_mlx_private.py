"""The mlx-lm assumptions of the worker: every private name it relies on
(``MLX_LM_PRIVATE_NAMES``) exists in the installed mlx-lm, that version is one pyproject.toml
allows, the subclass's contract with ``GenerationBatch`` holds, and the worker relies on no
private mlx-lm name the list leaves out. No model is loaded: mlx-lm's objects are built empty."""

from __future__ import annotations

import ast
import dataclasses
import importlib
import inspect
import tomllib
from importlib.metadata import version
from pathlib import Path
from typing import Any

from packaging.requirements import Requirement

from router.worker.engines import batchverify
from router.worker.mlx_private import MLX_LM_PRIVATE_NAMES

ROOT = Path(__file__).resolve().parents[2]
PYPROJECT = ROOT / "pyproject.toml"


def test_the_installed_mlx_lm_is_a_tested_version() -> None:
    deps = tomllib.loads(PYPROJECT.read_text())["project"]["dependencies"]
    (req,) = [Requirement(d) for d in deps if Requirement(d).name == "mlx-lm"]
    installed = version("mlx-lm")
    assert req.specifier.contains(installed), (
        f"mlx-lm {installed} is outside {req.specifier}: run this file and the realmodel "
        "tier (-m realmodel), then widen the range"
    )
    assert any(s.operator == "<" for s in req.specifier)  # an upper bound: no silent release


def _instances() -> dict[str, Any]:
    """An empty instance of each class listed (empty batches never call the model)."""
    from mlx_lm.generate import BatchGenerator
    from mlx_lm.models.cache import BatchKVCache, LRUPromptCache, PromptTrie

    generator = BatchGenerator(None)  # type: ignore[arg-type]
    return {
        "mlx_lm.generate.BatchGenerator": generator,
        "mlx_lm.generate.GenerationBatch": generator._generation_batch,
        "mlx_lm.models.cache.BatchKVCache": BatchKVCache([0]),
        "mlx_lm.models.cache.LRUPromptCache": LRUPromptCache(),
        "mlx_lm.models.cache.LRUPromptCache.CacheOrder": LRUPromptCache.CacheOrder(),
        "mlx_lm.models.cache.PromptTrie": PromptTrie(),
    }


def test_every_private_name_relied_on_exists() -> None:
    instances = _instances()
    missing = []
    for owner, names in MLX_LM_PRIVATE_NAMES.items():
        # (an empty batch is falsy: it has a length)
        where = instances[owner] if owner in instances else importlib.import_module(owner)
        missing += [f"{owner}.{name}" for name in names if not hasattr(where, name)]
    instances["mlx_lm.generate.BatchGenerator"].close()  # gives back a GPU's wired limit
    assert not missing, f"mlx-lm {version('mlx-lm')} no longer has {missing}"


def test_the_generation_batch_subclass_contract_holds() -> None:
    """What ``DraftingBatch`` overrides, calls and builds on mlx-lm's ``GenerationBatch``."""
    from mlx_lm.generate import GenerationBatch

    drafting = batchverify.batch_class()
    assert issubclass(drafting, GenerationBatch)
    assert list(inspect.signature(GenerationBatch.next).parameters) == ["self"]
    assert len(inspect.signature(GenerationBatch.filter).parameters) == 2  # self, the rows kept
    assert list(inspect.signature(GenerationBatch.extract_cache).parameters)[:2] == ["self", "idx"]
    fields = {f.name for f in dataclasses.fields(GenerationBatch.Response)}
    assert fields == {"uid", "token", "logprobs", "finish_reason", "prompt_cache", "all_tokens"}
    generator = batchverify.drafting_generator(None, lambda uids, histories, room: [])
    generator.close()  # nothing generates: only its batch is read
    batch = generator._generation_batch
    assert isinstance(batch, drafting) and batch.drafter is not None
    # The public per-row state it reads beside the private names.
    for name in ("uids", "tokens", "max_tokens", "samplers", "fallback_sampler"):
        assert hasattr(batch, name), name
    for name in ("logits_processors", "prompt_cache", "model"):
        assert hasattr(batch, name), name


FRAMEWORKS = ("mlx", "mlx_lm", "llguidance", "transformers")


def _imports_from_frameworks(tree: ast.AST) -> set[str]:
    """The names a module binds by importing from mlx, mlx-lm, llguidance or transformers
    (empty: the module touches none of their objects)."""
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] in FRAMEWORKS:
            names |= {a.asname or a.name for a in node.names}
        elif isinstance(node, ast.Import):
            names |= {
                a.asname or a.name.split(".")[0]
                for a in node.names
                if a.name.split(".")[0] in FRAMEWORKS
            }
    return names


def _private_reads(path: Path) -> set[str]:
    """The private attribute names a module reads or writes on the frameworks' objects: in a
    module that imports from them, ``x._name`` on anything but ``self``, ``cls`` and ``os``,
    and ``self._name`` in a class built on one of theirs (its own methods aside)."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    imported = _imports_from_frameworks(tree)
    if not imported:
        return set()

    def private(node: ast.AST) -> str | None:
        if isinstance(node, ast.Attribute) and node.attr.startswith("_"):
            if not node.attr.startswith("__"):
                return node.attr
        return None

    found = {
        name
        for node in ast.walk(tree)
        if (name := private(node)) is not None
        and not (
            isinstance(node, ast.Attribute)
            and isinstance(node.value, ast.Name)
            and node.value.id in {"self", "cls", "os"}
        )
    }
    for cls in ast.walk(tree):
        bases = {b.id for b in getattr(cls, "bases", ()) if isinstance(b, ast.Name)}
        if not isinstance(cls, ast.ClassDef) or not bases & imported:
            continue
        own = {n.name for n in cls.body if isinstance(n, ast.FunctionDef)}
        found |= {
            name
            for node in ast.walk(cls)
            if (name := private(node)) is not None and name not in own
        }
    return found


def test_the_router_relies_on_no_private_framework_name_left_unlisted() -> None:
    """A new ``_name`` on an mlx-lm object must be listed (or a public way found); this is
    what keeps ``MLX_LM_PRIVATE_NAMES`` the whole list."""
    listed = {name for names in MLX_LM_PRIVATE_NAMES.values() for name in names}
    unlisted = {
        str(path.relative_to(ROOT)): sorted(found - listed)
        for path in sorted((ROOT / "router").rglob("*.py"))
        if (found := _private_reads(path)) - listed
    }
    assert not unlisted, f"private names of mlx / mlx-lm objects not listed: {unlisted}"


def test_the_check_sees_the_names_batchverify_relies_on() -> None:
    """The scan above finds what it must (it would pass vacuously on a blind parser)."""
    found = _private_reads(Path(batchverify.__file__))  # wherever the module lives
    assert {"_generation_batch", "_idx", "_next_tokens", "_token_context"} <= found
    assert "_plain" not in found  # DraftingBatch's own method
