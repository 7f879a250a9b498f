"""A policy reload that changes ``[spec]`` overrides reaches workloads that already have a
state (``AutoDisable.reconfigure``), as docs/speculation.md promises."""

from __future__ import annotations

import time
from pathlib import Path

from router.app import wire
from router.config.settings import load_settings
from router.speculation.keystate import SpecKey


def _write(directory: Path, window: int) -> None:
    (directory / "agent.toml").write_text(
        f'client = "agent"\n[match]\nclient_header = ["agent"]\n[spec]\nwindow_size = {window}\n'
    )


async def test_reloaded_spec_overrides_reach_an_existing_workload(tmp_path: Path) -> None:
    _write(tmp_path, 256)
    services = wire(
        load_settings(
            None, policies_dir=tmp_path, lanes={"enabled": False}, policy_settle_seconds=0
        )
    ).services
    auto = services.spec.auto
    key = SpecKey("lms", "m", "agent:none")
    auto.verdict(key, time.monotonic())  # the workload now has a state
    row = next(r for r in auto.snapshot(time.monotonic()) if r["workload"] == "agent:none")
    assert row["window"]["size"] == 256

    _write(tmp_path, 1024)
    assert (await services.policies.reload("test")).ok
    row = next(r for r in auto.snapshot(time.monotonic()) if r["workload"] == "agent:none")
    assert row["window"]["size"] == 1024


async def test_a_failed_reload_changes_nothing(tmp_path: Path) -> None:
    _write(tmp_path, 256)
    services = wire(
        load_settings(
            None, policies_dir=tmp_path, lanes={"enabled": False}, policy_settle_seconds=0
        )
    ).services
    auto = services.spec.auto
    key = SpecKey("lms", "m", "agent:none")
    auto.verdict(key, time.monotonic())
    (tmp_path / "agent.toml").write_text("client = \n")  # invalid TOML
    assert not (await services.policies.reload("test")).ok
    row = next(r for r in auto.snapshot(time.monotonic()) if r["workload"] == "agent:none")
    assert row["window"]["size"] == 256
