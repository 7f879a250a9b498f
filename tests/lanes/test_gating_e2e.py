"""Capability gating with the real lanes: a mismatched draft stops a strict start-up with an
actionable message, and in graceful mode the lane serves without speculation while every
status surface says why."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import urllib.request
from pathlib import Path
from typing import Any

import pytest

from router.cli.status import main as status_main
from router.lanes.modelprep import ensure_default_models
from tests.conftest import metric_value
from tests.lanes.test_lanes_e2e import ask
from tests.realmodel import start_router, stop_router

pytestmark = pytest.mark.realmodel


def mismatched_draft(tmp: Path) -> Path:
    """The default draft with two ordinary tokens swapped: same size, different vocabulary."""
    _, draft = ensure_default_models(quiet=True)
    dest = tmp / "bad-draft"
    dest.mkdir()
    for item in draft.iterdir():
        if item.suffix == ".safetensors":
            (dest / item.name).symlink_to(item)
        elif item.is_file():
            shutil.copy(item, dest / item.name)
    tok = json.loads((dest / "tokenizer.json").read_text())
    vocab = tok["model"]["vocab"]
    vocab["the"], vocab["and"] = vocab["and"], vocab["the"]
    (dest / "tokenizer.json").write_text(json.dumps(tok))
    return dest


def get_json(url: str) -> Any:
    with urllib.request.urlopen(url) as resp:
        return json.loads(resp.read())


def test_strict_mode_refuses_to_start_and_names_the_setting(tmp_path: Path) -> None:
    draft = mismatched_draft(tmp_path)
    (tmp_path / "policies").mkdir()
    config = tmp_path / "speclane.toml"
    config.write_text(
        f'policies_dir = "{tmp_path}/policies"\n[gating]\nmode = "strict"\n'
        f'[lanes]\ndraft_model = "{draft}"\n'
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith("SPECLANE_")}
    done = subprocess.run(
        [sys.executable, "-m", "router", "serve", "--config", str(config), "--port", "0"],
        capture_output=True,
        text=True,
        timeout=240,
        env=env,
    )
    assert done.returncode != 0
    assert "listening" not in done.stdout
    assert "vocab" in done.stderr and "lanes.draft_model" in done.stderr


def test_graceful_mode_serves_without_speculation_and_says_why(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    draft = mismatched_draft(tmp_path)
    # Its own router, with a draft the gate refuses. A fixed draft_model: without it no source
    # drafts (auto would fall back to prompt lookup, routing.speculate.lane_sources).
    router = start_router(tmp_path, f'draft_model = "{draft}"\ndraft_source = "draft_model"\n')
    root = router.base_url.removesuffix("/v1")
    try:
        lanes = get_json(f"{root}/admin/lanes")
        spec = next(b for b in lanes["backends"] if b["name"] == "speculative")["speculation"]
        assert spec["requested"] is True and spec["active"] is False
        assert spec["mode"] == "graceful" and "vocab" in spec["reason"]
        text = router.metrics()
        assert metric_value(text, "speclane_spec_requested", backend="speculative") == 1
        assert metric_value(text, "speclane_spec_active", backend="speculative") == 0
        assert status_main(["--url", root]) == 0
        assert "vocab" in capsys.readouterr().out
        answer, usage, headers = ask(router, "speculative", False)
        assert "Paris" in answer and headers["x-speclane-lane"] == "speculative"
        assert usage["speclane_spec"]["drafted"] == 0
        assert any("WITHOUT speculation" in line for line in router.output)
    finally:
        stop_router(router)
