"""Worker counters from /health into the router's prompt-cache metrics."""

from __future__ import annotations

from typing import Any

from router.lanes.figures import WorkerFigures, cache_counters, increase
from router.metrics import Metrics


def health(pid: int, lookups: int, hits: int, reused: int, prefilled: int) -> dict[str, Any]:
    return {
        "pid": pid,
        "prompt_cache": {
            "lookups": lookups,
            "hits": hits,
            "bytes": 4096,
            "reused_tokens": reused,
            "prefilled_tokens": prefilled,
        },
    }


def test_cache_counters_ignore_malformed_values() -> None:
    assert cache_counters({"prompt_cache": {"lookups": 3, "hits": "x", "bytes": -1}}) == {
        "lookups": 3
    }
    assert cache_counters({"prompt_cache": []}) == {}
    assert cache_counters(None) == {}


def test_increase_treats_a_decrease_as_a_new_worker() -> None:
    assert increase({"lookups": 5}, {"lookups": 7}) == {"lookups": 2}
    assert increase({"lookups": 5}, {"lookups": 2}) == {"lookups": 2}
    assert increase({}, {"hits": 1}) == {"hits": 1}


def sample(metrics: Metrics, name: str, **labels: str) -> float:
    value = metrics.registry.get_sample_value(name, labels)
    return 0.0 if value is None else value


def test_figures_accumulate_across_health_checks_and_restarts() -> None:
    metrics = Metrics()
    figures = WorkerFigures("batching", metrics)
    figures.observe(health(1, lookups=1, hits=0, reused=0, prefilled=700))
    figures.observe(health(1, lookups=2, hits=1, reused=690, prefilled=720))
    figures.observe(health(1, lookups=2, hits=1, reused=690, prefilled=720))  # nothing new
    figures.observe(health(2, lookups=1, hits=1, reused=50, prefilled=10))  # restarted
    tokens = "speclane_prompt_cache_tokens_total"
    assert sample(metrics, tokens, lane="batching", kind="reused") == 740
    assert sample(metrics, tokens, lane="batching", kind="prefilled") == 730
    lookups = "speclane_prompt_cache_lookups_total"
    assert sample(metrics, lookups, lane="batching", result="hit") == 2
    assert sample(metrics, lookups, lane="batching", result="miss") == 1
    assert sample(metrics, "speclane_prompt_cache_bytes", lane="batching") == 4096


def test_a_worker_without_a_prompt_cache_exports_nothing() -> None:
    metrics = Metrics()
    WorkerFigures("speculative", metrics).observe({"pid": 1, "status": "ok"})
    assert b"speclane_prompt_cache_tokens_total{" not in metrics.render()


def test_the_disk_tiers_figures_become_metrics_across_restarts() -> None:
    metrics = Metrics()
    figures = WorkerFigures("speculative", metrics)

    def with_disk(pid: int, hits: int, writes: int, refused: int) -> dict[str, Any]:
        body = health(pid, lookups=1, hits=1, reused=10, prefilled=1)
        disk = {"bytes": 9000, "hits": hits, "writes": writes, "dropped": 0, "refused": refused}
        body["prompt_cache"]["disk"] = {**disk, "evicted": 0, "entries": 3}
        return body

    figures.observe(with_disk(1, hits=1, writes=4, refused=0))
    figures.observe(with_disk(1, hits=2, writes=6, refused=1))
    figures.observe(with_disk(2, hits=1, writes=0, refused=0))  # restarted: found on disk
    disk = "speclane_prompt_cache_disk_total"
    assert sample(metrics, disk, lane="speculative", event="hits") == 3
    assert sample(metrics, disk, lane="speculative", event="writes") == 6
    assert sample(metrics, disk, lane="speculative", event="refused") == 1
    assert sample(metrics, "speclane_prompt_cache_disk_bytes", lane="speculative") == 9000
