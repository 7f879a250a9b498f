"""router.backends.status: what the admin API shows of a lane, read from its backend."""

from __future__ import annotations

from router.backends.status import backend_status
from router.config.settings import load_settings
from router.lanes.group import lane_backend


def test_a_lanes_draft_figures_are_shown_without_its_secret_or_the_rest_of_its_health() -> None:
    settings = load_settings(None, backends=[])
    backend = lane_backend("speculative", settings, "m")
    backend.worker_secret = "s3cret"
    backend.reported = {
        "mode": "speculative",
        "draft_source": "auto",
        "draft_position_cost": {"1": 0.07},
        "draft_pass_jump": {"1": 0.1},
        "draft_model_cost": 1.02,
        "evidence_partitions": 3,
        "prompt_cache": {"bytes": 1},
    }
    shown = backend_status(backend, {"speculative": "ready"})
    worker = shown["worker"]
    assert worker["draft_source"] == "auto"
    assert worker["draft_position_cost"] == {"1": 0.07}
    assert worker["draft_pass_jump"] == {"1": 0.1}
    assert (worker["draft_model_cost"], worker["evidence_partitions"]) == (1.02, 3)
    assert "prompt_cache" not in worker and "s3cret" not in repr(shown)
