"""The documentation and the code name the same things.

Every knob the code defines (the settings and policy models: ``docs/configuration.md``
with its default and environment variable; the commands' flags), header
(``router/config/names.py``: ``docs/routing.md``), metric (``router/metrics.py``:
``docs/metrics.md``) and endpoint (the app's route table: ``docs/frontdoors.md``) is
documented, and every one the documentation names as such exists in the code. The lists come
from the code itself (the pydantic models, the metrics registry, the app's router, the
argument parsers), so a new knob, header, metric or endpoint fails here until it is
documented. Every relative link leads to a file and every ``#anchor`` to a heading; every
file named in backticks exists.

``docs/incoming/`` holds notes waiting to be folded into the pages: not read here.
"""

from __future__ import annotations

import os
import re
import typing
from pathlib import Path, PurePath
from typing import Any

import pytest
from pydantic import BaseModel

from router.config import names
from router.config.gating import PairRule
from router.config.policies import Policy
from router.config.presets import PresetSpec
from router.config.settings import BackendSpec, LanesSettings, ModelEntry, Settings, load_settings
from router.config.speculation import SpecOverrides, SpecSettings
from router.kernel import errors as kernel_errors
from router.metrics import Metrics

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"
CONFIGURATION = DOCS / "configuration.md"
ENDPOINTS_PAGE = DOCS / "frontdoors.md"
METRICS_PAGE = DOCS / "metrics.md"
HEADERS_PAGE = DOCS / "routing.md"
README_MAX_LINES = 300


# speclane_* words in the documentation that are not metrics.
# The draft statistics in a lane answer's usage, and the field a stream carries them in when
# its client asked for no usage (router.kernel.worker_contract.STREAM_USAGE_FIELD).
NOT_METRICS = {"speclane_spec", "speclane_usage"}
# Keys of [spec] that a policy cannot override (configuration.md says so).
GLOBAL_ONLY_SPEC = {"scrape_interval", "max_keys"}


@pytest.fixture(autouse=True)
def _no_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for key in list(os.environ):
        if key.startswith("SPECLANE_"):
            monkeypatch.delenv(key)


def documentation() -> list[Path]:
    pages = [
        ROOT / "README.md",
        *sorted(DOCS.rglob("*.md")),
        *sorted((ROOT / "examples" / "results").glob("*.md")),
    ]
    return [p for p in pages if "incoming" not in p.relative_to(ROOT).parts]


def all_text() -> str:
    return "\n".join(p.read_text(encoding="utf-8") for p in documentation())


# ---------------------------------------------------------------------------------------
# Knobs: the settings models and the policy model, walked as configuration.md shows them.


def render(value: Any) -> str:
    """A default as configuration.md writes it."""
    if value is None:
        return "unset"
    if isinstance(value, bool):
        return "`true`" if value else "`false`"
    if isinstance(value, str | PurePath):
        return f'`"{value}"`'
    if isinstance(value, tuple):
        return f"`{list(value)!r}`" if value else "`[]`"
    if isinstance(value, dict):
        return ", ".join(f"`{k}`" for k in value) if value else "`{}`"
    return f"`{value}`"


def nested_model(annotation: Any) -> type[BaseModel] | None:
    for t in (annotation, *typing.get_args(annotation)):
        if isinstance(t, type) and issubclass(t, BaseModel):
            return t
    return None


def knobs(
    model: type[BaseModel], prefix: str = "", env: str | None = None, leaves: tuple[str, ...] = ()
) -> dict[str, tuple[str, str]]:
    """key -> (default, environment variable) for every knob of ``model``; a nested model
    with a default instance is a table whose keys are ``table.key``."""
    out: dict[str, tuple[str, str]] = {}
    for name, field in model.model_fields.items():
        key = prefix + name
        variable = f"`{env}{name.upper()}`" if env is not None else "-"
        if field.is_required():
            out[key] = ("required", variable)
            continue
        default = field.get_default(call_default_factory=True)
        sub = nested_model(field.annotation)
        if sub is not None and isinstance(default, BaseModel) and key not in leaves:
            out |= knobs(sub, key + ".", None if env is None else f"{env}{name.upper()}__", leaves)
        else:
            out[key] = (render(default), variable)
    return out


def settings_knobs() -> dict[str, tuple[str, str]]:
    return (
        knobs(Settings, env="SPECLANE_")
        | knobs(BackendSpec, "backends[].")
        | knobs(PresetSpec, "presets.<name>.")
        | knobs(PairRule, "gating.pairs[].")
        | knobs(ModelEntry, "lanes.models[].")
    )


def policy_knobs() -> dict[str, tuple[str, str]]:
    found = knobs(Policy, leaves=("spec",))
    found["client"] = ("the file's name", "-")
    del found["spec"]
    found["spec.*"] = ("inherited", "-")  # SpecOverrides: checked apart
    return found


def documented_knobs() -> tuple[dict[str, tuple[str, str]], dict[str, tuple[str, str]]]:
    """(speclane.toml knobs, policy knobs) from configuration.md's ``| key | default |``
    tables: key -> (default, environment variable or "-")."""
    settings: dict[str, tuple[str, str]] = {}
    policy: dict[str, tuple[str, str]] = {}
    section = ""
    header: list[str] = []
    for line in CONFIGURATION.read_text(encoding="utf-8").splitlines():
        if line.startswith("## "):
            section, header = line, []
            continue
        if not line.startswith("| "):
            header = []
            continue
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if not header:
            header = cells
            continue
        if header[:2] != ["key", "default"] or set(cells[0]) <= {"-", " "}:
            continue
        key = cells[0].strip("`")
        variable = cells[header.index("environment")] if "environment" in header else "-"
        target = policy if section == "## Policy files" else settings
        assert key not in target, f"configuration.md documents {key} twice"
        target[key] = (cells[1], variable)
    return settings, policy


def test_every_setting_is_documented_with_its_default_and_variable() -> None:
    in_code = settings_knobs()
    in_docs, _ = documented_knobs()
    assert sorted(set(in_code) - set(in_docs)) == [], "knobs missing from configuration.md"
    assert sorted(set(in_docs) - set(in_code)) == [], "documented knobs the code does not have"
    wrong = {k: (in_docs[k], v) for k, v in in_code.items() if in_docs[k] != v}
    assert wrong == {}, "documented (default, variable) differs from the code's"


def test_every_policy_key_is_documented_with_its_default() -> None:
    in_code = policy_knobs()
    _, in_docs = documented_knobs()
    assert sorted(set(in_code) - set(in_docs)) == [], "policy keys missing from configuration.md"
    assert sorted(set(in_docs) - set(in_code)) == [], "documented policy keys the code lacks"
    wrong = {k: (in_docs[k][0], v[0]) for k, v in in_code.items() if in_docs[k][0] != v[0]}
    assert wrong == {}


def test_a_policy_overrides_every_spec_key_but_the_global_ones() -> None:
    # configuration.md documents a policy's [spec] as "any spec.* key but these".
    assert set(SpecOverrides.model_fields) == set(SpecSettings.model_fields) - GLOBAL_ONLY_SPEC
    text = CONFIGURATION.read_text(encoding="utf-8")
    assert all(f"`{key}`" in text for key in GLOBAL_ONLY_SPEC)


# ---------------------------------------------------------------------------------------
# Commands and their flags, from the commands' own argument parsers.


def flags_of(main: Any, argv: list[str], capsys: pytest.CaptureFixture[str]) -> set[str]:
    try:
        main(argv)
    except SystemExit:  # argparse's --help (some commands catch it themselves)
        pass
    usage = capsys.readouterr().out
    return set(re.findall(r"(?<![\w-])--[a-z][a-z-]*", usage)) - {"--help"}


def test_every_command_and_flag_is_documented(capsys: pytest.CaptureFixture[str]) -> None:
    from router.cli import main, policy, serve, status

    text = all_text()
    missing = [f"speclane {name}" for name in main.COMMANDS if f"speclane {name}" not in text]
    commands = {
        "serve": flags_of(serve.parse_args, ["--help"], capsys),
        "status": flags_of(status.parse_args, ["--help"], capsys),
        "policy check": flags_of(policy.main, ["check", "--help"], capsys),
    }
    assert commands["serve"] >= {"--config", "--port", "--no-lanes"}  # the parser was read
    reference = CONFIGURATION.read_text(encoding="utf-8")
    missing += [
        f"speclane {command} {flag}"
        for command, flags in commands.items()
        for flag in sorted(flags)
        if f"`{flag}" not in reference
    ]
    assert missing == []


def test_documented_serve_flags_exist(capsys: pytest.CaptureFixture[str]) -> None:
    from router.cli import serve

    flags = flags_of(serve.parse_args, ["--help"], capsys)
    table = section_of(CONFIGURATION, "## `speclane serve` flags")
    documented = set(re.findall(r"^\| `(--[a-z-]+)", table, re.M))
    assert documented == flags


def test_documented_worker_flags_exist() -> None:
    """docs/lanes.md names the lane worker's flags beside the [lanes] settings."""
    import argparse

    from router.kernel.worker_contract import add_worker_flags

    parser = argparse.ArgumentParser()
    add_worker_flags(parser, required=False)
    flags = set(re.findall(r"(?<![\w-])--[a-z][a-z-]*", parser.format_help()))
    text = (DOCS / "lanes.md").read_text(encoding="utf-8")
    documented = set(re.findall(r"`(--[a-z][a-z-]*)", text)) - {"--no-lanes"}
    assert documented, "docs/lanes.md names no worker flag?"
    assert sorted(documented - flags) == []


# ---------------------------------------------------------------------------------------
# Headers and metrics.


def header_names() -> set[str]:
    """The router's headers (config/names.py) and the one both programs send (the error
    core's source header)."""
    return {
        value
        for module in (names, kernel_errors)
        for name, value in vars(module).items()
        if name.endswith("_HEADER") and isinstance(value, str)
    }


def test_every_header_is_documented_and_no_documented_header_is_gone() -> None:
    text = all_text()
    in_code = header_names()
    assert in_code, "router/config/names.py defines no headers?"
    reference = section_of(HEADERS_PAGE, "## Headers")
    assert sorted(h for h in in_code if f"`{h}" not in reference) == [], (
        "headers missing from docs/routing.md's tables"
    )
    mentioned = set(re.findall(r"X-Speclane-[A-Za-z]+(?:-[A-Za-z]+)*", text))
    from router.kernel import (
        worker_contract as contract,  # router -> lane headers: the worker contract's
    )

    internal = {
        value
        for name, value in vars(contract).items()
        if name.endswith("_HEADER") and isinstance(value, str)
    }
    assert sorted(mentioned - in_code - internal) == [], (
        "documented headers the code does not define"
    )


def metric_names() -> tuple[set[str], set[str]]:
    """(the metrics as documented: a counter with its ``_total``; every series name the
    registry exposes), for speclane's own metrics."""
    families: set[str] = set()
    series: set[str] = set()
    for family in Metrics().registry.collect():
        if not family.name.startswith("speclane_"):
            continue  # process_*, python_*: prometheus_client's standard collectors
        families.add(family.name + "_total" if family.type == "counter" else family.name)
        series.update(sample.name for sample in family.samples)
    return families, series | families


def test_every_metric_is_documented_and_no_documented_metric_is_gone() -> None:
    text = all_text()
    families, series = metric_names()
    assert "speclane_requests_total" in families  # the registry was read
    reference = section_of(METRICS_PAGE, "## Metrics")
    documented = set(re.findall(r"^\| `(speclane_[a-z0-9_]+)` \|", reference, re.M))
    assert sorted(families - documented) == [], "metrics missing from docs/metrics.md's table"
    mentioned = set(re.findall(r"\bspeclane_[a-z0-9_]+(?![a-z0-9_*])", text))
    assert sorted(mentioned - series - NOT_METRICS) == [], (
        "documented metrics the code does not define"
    )


# ---------------------------------------------------------------------------------------
# Endpoints, from the app's route table.


def routes() -> set[str]:
    from router.app import make_app

    settings = load_settings(
        lanes=LanesSettings.model_validate({"enabled": False}), policies_dir=ROOT / "policies"
    )
    app = make_app(settings)
    return {
        f"{route.method} {route.resource.canonical}"
        for route in app.router.routes()
        if route.resource is not None
    }


def section_of(page: Path, heading: str) -> str:
    text = page.read_text(encoding="utf-8")
    start = text.index(heading + "\n")
    end = text.find("\n## ", start + len(heading))
    return text[start:] if end < 0 else text[start:end]


def test_every_endpoint_is_documented_and_no_documented_endpoint_is_gone() -> None:
    in_code = routes()
    assert "POST /v1/chat/completions" in in_code  # the table was read
    table = section_of(ENDPOINTS_PAGE, "## Endpoints")
    # aiohttp answers HEAD wherever GET is routed; only GET is documented for those.
    missing = sorted(r for r in in_code if not r.startswith("HEAD ") and f"`{r}`" not in table)
    assert missing == [], "endpoints missing from docs/frontdoors.md's table"
    documented = set(re.findall(r"`((?:GET|POST|PUT|PATCH|DELETE|HEAD) /[^`\s]*)`", table))
    assert sorted(documented - in_code) == [], "documented endpoints the app does not route"


# ---------------------------------------------------------------------------------------
# The pages themselves.


def slug(heading: str) -> str:
    """GitHub's anchor for a heading."""
    text = heading.strip().lower().replace("`", "")
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def anchors(page: Path) -> set[str]:
    text = re.sub(r"```.*?```", "", page.read_text(encoding="utf-8"), flags=re.S)
    return {slug(m) for m in re.findall(r"^#+ (.+)$", text, re.M)}


def test_every_link_leads_somewhere() -> None:
    broken = []
    for page in documentation():
        text = re.sub(r"```.*?```", "", page.read_text(encoding="utf-8"), flags=re.S)
        for target in re.findall(r"\]\(([^)\s]+)\)", text):
            if re.match(r"[a-z]+:", target):
                continue  # http:, https:, mailto:
            path, _, anchor = target.partition("#")
            file = (page.parent / path).resolve() if path else page
            name = f"{page.relative_to(ROOT)} -> {target}"
            if not file.exists():
                broken.append(name)
                continue
            if anchor and file.suffix == ".md" and anchor not in anchors(file):
                broken.append(name)
    assert broken == []


FILE_NAME = re.compile(
    r"`((?:[\w.*-]+/)+(?:[\w.*-]+\.(?:py|md|toml|json5?|yml|sh|txt|png|"
    r"service|plist))?)`"
)


def test_every_file_named_exists() -> None:
    """A path in backticks (``router/proxy/relay.py``, ``proxy/relay.py`` inside router/,
    ``examples/grafana/``) names a file or folder that exists."""
    gone = []
    for page in documentation():
        for name in FILE_NAME.findall(page.read_text(encoding="utf-8")):
            if name.startswith(("docs/incoming", "mlx_lm/", "text/", "./", "bench-results/")):
                continue  # not ours, not a path, or what a command writes
            if not any(any(base.glob(name.rstrip("/"))) for base in (ROOT, ROOT / "router")):
                gone.append(f"{page.relative_to(ROOT)}: {name}")
    assert gone == []


CODE_BLOCK = re.compile(r"^```[^\n]*\n(.*?)^```", re.S | re.M)
# A relative path in a code block (a command's argument, a comment): not after a slash, a
# dot, ~, $ or a scheme, so /etc/..., ~/.cache/..., $HOME/... and URLs are left alone.
PATH_IN_CODE = re.compile(
    r"(?<![\w./~$:-])((?:[\w*.-]+/)+[\w*.-]+\.(?:py|md|toml|json5?|ya?ml|sh|txt|png|"
    r"service|plist|html))\b"
)
# Files a page asks the reader to write (its example's name), not files of the repository.
WRITTEN_BY_THE_READER = {"policies/ci-bot.toml"}
# A folder tree (``router/`` then indented ``config/`` ...): an entry is a folder name with
# its slash, or a file name, at the start of a line; the lines after it describe it.
TREE_FOLDER = re.compile(r"^( *)([\w.-]+/)(?=[ :]|$)")
TREE_FILE = re.compile(r"^( *)[\w-]+\.\w+(?= |$)")
BARE_MODULE = re.compile(r"(?<![\w./-])([\w-]+\.py)\b")


def tree_modules(block: str) -> list[tuple[str, str]]:
    """(folder, module) for every ``name.py`` a folder tree names, in the folder whose
    entry (or description) names it: ``config/ ... (watch.py)`` is router/config/**/watch.py."""
    entries: list[tuple[int, str]] = []  # the open folders: (indent, name/)
    named = []
    for line in block.splitlines():
        entry = TREE_FOLDER.match(line) or TREE_FILE.match(line)
        if entry:
            indent = len(entry.group(1))
            while entries and entries[-1][0] >= indent:
                entries.pop()  # a sibling or an entry further out closes the deeper ones
            if entry.re is TREE_FOLDER:
                entries.append((indent, entry.group(2)))
        folder = "".join(name for _, name in entries)
        named += [(folder, module) for module in BARE_MODULE.findall(line) if folder]
    return named


def test_every_file_named_in_a_code_block_exists() -> None:
    """Code blocks too: a relative path (``python examples/openai_sdk.py``) names a file of
    the repository, and a folder tree's ``name.py`` is in the folder it is listed under."""
    gone = []
    for page in documentation():
        where = page.relative_to(ROOT)
        for block in CODE_BLOCK.findall(page.read_text(encoding="utf-8")):
            for name in PATH_IN_CODE.findall(block):
                exists = any(any(base.glob(name)) for base in (ROOT, ROOT / "router"))
                if not exists and name not in WRITTEN_BY_THE_READER:
                    gone.append(f"{where}: {name}")
            if TREE_FOLDER.match(block):
                for folder, module in tree_modules(block):
                    if not any((ROOT / folder).rglob(module)):
                        gone.append(f"{where}: {module} under {folder}")
    assert gone == []


def test_the_readme_stays_short() -> None:
    lines = (ROOT / "README.md").read_text(encoding="utf-8").count("\n")
    assert lines <= README_MAX_LINES, "the README is the way in; reference goes to docs/"


def test_the_readme_keeps_the_two_commands() -> None:
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    assert "./docker-less-run.sh          #" in text
    assert "./docker-less-run.sh test     #" in text
