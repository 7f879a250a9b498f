"""Auto-disable settings: defaults, validation, per-policy overrides."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from router.config.settings import load_settings
from router.config.speculation import SpecOverrides, SpecSettings


def test_defaults_are_valid_and_have_hysteresis() -> None:
    s = SpecSettings()
    assert s.on_threshold > s.off_threshold
    assert s.on_speed_margin > s.off_speed_margin
    assert s.probe_min_spacing <= s.probe_initial <= s.probe_max


@pytest.mark.parametrize(
    ("fields", "names"),
    [
        ({"off_threshold": 0.5, "on_threshold": 0.4}, "on_threshold"),
        ({"off_speed_margin": 0.2, "on_speed_margin": 0.1}, "on_speed_margin"),
        ({"window_size": 100, "min_sample": 200}, "min_sample"),
        ({"speed_window": 3, "min_speed_samples": 4}, "min_speed_samples"),
        ({"probe_min_spacing": 60, "probe_initial": 30}, "probe_min_spacing"),
        ({"probe_initial": 3600, "probe_max": 1800}, "probe_max"),
    ],
)
def test_inconsistent_combinations_are_refused_by_name(fields: dict, names: str) -> None:
    with pytest.raises(ValidationError, match=names):
        SpecSettings(**fields)


@pytest.mark.parametrize(
    "fields",
    [
        {"off_threshold": 1.5},
        {"probe_backoff": 0.5},
        {"window_size": 0},
        {"window_unit": "bytes"},
        {"probe_min_spacing": 0},
        {"surprise": 1},
    ],
)
def test_out_of_range_values_are_refused(fields: dict) -> None:
    with pytest.raises(ValidationError):
        SpecSettings(**fields)


def test_overrides_merge_over_the_global_settings() -> None:
    base = SpecSettings(off_threshold=0.2, on_threshold=0.4)
    merged = base.merged(SpecOverrides(on_threshold=0.6, probes_to_enable=5))
    assert (merged.off_threshold, merged.on_threshold, merged.probes_to_enable) == (0.2, 0.6, 5)
    assert base.merged(None) is base and base.merged(SpecOverrides()) is base


def test_a_merge_that_breaks_hysteresis_is_refused() -> None:
    with pytest.raises(ValidationError, match="on_threshold"):
        SpecSettings().merged(SpecOverrides(off_threshold=0.9))


def test_global_only_fields_cannot_be_overridden() -> None:
    with pytest.raises(ValidationError):
        SpecOverrides(max_keys=3)  # type: ignore[call-arg]
    with pytest.raises(ValidationError):
        SpecOverrides(off_threshold=2.0)


def test_loaded_from_the_config_file_section(tmp_path) -> None:
    path = tmp_path / "speclane.toml"
    path.write_text("[spec]\noff_threshold = 0.25\non_threshold = 0.5\nwindow_unit = 'rounds'\n")
    spec = load_settings(path).spec
    assert (spec.off_threshold, spec.on_threshold, spec.window_unit) == (0.25, 0.5, "rounds")
