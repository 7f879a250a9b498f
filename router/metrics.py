"""Every Prometheus metric speclane exports, defined in this one module.

A ``Metrics`` object owns its own registry so that each app (and each test) has
independent series. Label sets are small and fixed: backend and lane names come from
configuration, clients from policy files, workloads from configured classes, and
reasons from a closed vocabulary; nothing here is labelled with free text.
"""

from __future__ import annotations

from collections.abc import Iterator
from importlib import metadata
from typing import Any

import prometheus_client
from prometheus_client import (
    CollectorRegistry,
    GCCollector,
    PlatformCollector,
    ProcessCollector,
    generate_latest,
)
from prometheus_client.exposition import CONTENT_TYPE_LATEST
from prometheus_client.metrics import MetricWrapperBase
from prometheus_client.metrics_core import Metric
from prometheus_client.samples import Sample

LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300)
OVERHEAD_BUCKETS = (0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1)
TOKS_BUCKETS = (1, 2, 5, 10, 20, 30, 50, 75, 100, 150, 200, 300, 500, 1000)

CONTENT_TYPE = CONTENT_TYPE_LATEST
CLIENT_LABEL = "client"  # names a policy: what an unauthenticated closed router leaves out


class _CachedLabels(MetricWrapperBase):
    """``labels()`` remembered per label tuple.

    prometheus_client validates the values and takes a lock on every ``labels()`` call; the
    relay makes several per request with the same few label sets, and that showed up as a
    measurable share of speclane's time per request (``speclane bench overhead``).
    Nothing removes children from these metrics, so a remembered child never goes stale.
    """

    def labels(self, *values: Any, **kw: Any) -> Any:
        if kw or not values:
            return super().labels(*values, **kw)
        cache: dict[tuple[Any, ...], Any] = self.__dict__.setdefault("_children_by_values", {})
        child = cache.get(values)
        if child is None:
            child = cache[values] = super().labels(*values)
        return child


class Counter(_CachedLabels, prometheus_client.Counter):
    pass


class Gauge(_CachedLabels, prometheus_client.Gauge):
    pass


class Histogram(_CachedLabels, prometheus_client.Histogram):
    pass


def package_version(name: str) -> str:
    """A distribution's installed version without importing it (importing mlx is slow),
    or "none" when it is not installed (the router runs without MLX on other machines)."""
    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return "none"


def build_labels() -> dict[str, str]:
    from router import __version__

    return {
        "version": __version__,
        "mlx": package_version("mlx"),
        "mlx_lm": package_version("mlx-lm"),
    }


class Metrics:
    def __init__(self) -> None:
        r = self.registry = CollectorRegistry(auto_describe=True)
        # The standard collectors (process_* memory, CPU, file descriptors; python_info;
        # python_gc_*), on our own registry: the global one is not what /metrics renders.
        # (prometheus_client's defaults are bound to its global registry, so new ones here.)
        ProcessCollector(registry=r)
        PlatformCollector(registry=r)
        GCCollector(registry=r)
        labels = build_labels()
        self.build_info = Gauge(
            "speclane_build_info",
            "Always 1; the labels say which speclane, mlx and mlx-lm versions run "
            "('none' when not installed).",
            list(labels),
            registry=r,
        )
        self.build_info.labels(**labels).set(1)

        # --- the proxy core ---------------------------------------------------------
        self.requests = Counter(
            "speclane_requests_total",
            "Requests answered, by endpoint, HTTP status, the API the client called (openai, "
            "responses, anthropic, ollama), backend: the one that answered, else the last "
            "one tried, else 'none' (refused before any backend was tried), and model: the "
            "served model it was routed to, else 'none'.",
            ["endpoint", "backend", "status", "api", "model"],
            registry=r,
        )
        self.request_duration = Histogram(
            "speclane_request_duration_seconds",
            "Time from request arrival to the last byte sent to the client.",
            ["endpoint", "backend", "api", "model"],
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        self.ttft = Histogram(
            "speclane_ttft_seconds",
            "Streams only: time from request arrival to the first body byte relayed to the "
            "client (a non-streaming answer's first byte is the whole answer: see "
            "speclane_request_duration_seconds).",
            ["endpoint", "backend", "api", "model"],
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        self.overhead = Histogram(
            "speclane_overhead_seconds",
            "Time spent inside speclane before the request was sent upstream.",
            ["endpoint"],
            buckets=OVERHEAD_BUCKETS,
            registry=r,
        )
        self.inflight = Gauge(
            "speclane_inflight_requests",
            "Requests currently being relayed, per backend.",
            ["backend"],
            registry=r,
        )
        self.backend_up = Gauge(
            "speclane_backend_up",
            "1 when the backend answered its last health check, else 0.",
            ["backend"],
            registry=r,
        )
        self.retries = Counter(
            "speclane_upstream_retries_total",
            "Attempts repeated (on the next candidate) after a failure before the first byte "
            "reached the client, by the backend that failed and why.",
            ["backend", "reason"],
            registry=r,
        )
        self.failures = Counter(
            "speclane_upstream_failures_total",
            "Upstream attempts that failed (timeout, connect, disconnect, empty, status_NNN, "
            "...), whether or not they were retried.",
            ["backend", "reason"],
            registry=r,
        )
        self.cooldowns = Counter(
            "speclane_backend_cooldowns_total",
            "Times a backend was cooled down after repeated failures.",
            ["backend"],
            registry=r,
        )
        self.stream_errors = Counter(
            "speclane_stream_errors_total",
            "Streams ended with an error event after bytes had reached the client (reason: "
            "timeout, disconnect, malformed, too_large, no_done, shutdown, upstream_error, "
            "invalid, internal).",
            ["backend", "reason"],
            registry=r,
        )
        self.client_disconnects = Counter(
            "speclane_client_disconnects_total",
            "Requests whose client went away before the answer was complete.",
            ["backend"],
            registry=r,
        )

        # --- the MLX lanes (supervisor) ----------------------------------------------
        self.worker_up = Gauge(
            "speclane_worker_up",
            "1 while the lane's worker process is ready.",
            ["lane"],
            registry=r,
        )
        self.worker_restarts = Counter(
            "speclane_worker_restarts_total",
            "Worker processes restarted after dying.",
            ["lane", "reason"],
            registry=r,
        )
        self.worker_memory = Gauge(
            "speclane_worker_memory_bytes",
            "A lane worker process's memory: resident (kind=rss) and proportional (kind=pss, "
            "shared pages split between processes) set size; lanes: the lanes it serves.",
            ["lanes", "kind"],
            registry=r,
        )
        self.group_host_memory = Gauge(
            "speclane_group_host_memory_bytes",
            "A lane over a group of ranks ([lanes.group]): the resident memory of its ranks on "
            "one host, as rank 0 last gathered it; lanes: the lanes it serves.",
            ["lanes", "host"],
            registry=r,
        )
        self.lanes_layout = Gauge(
            "speclane_lanes_layout",
            "1 for the lanes' layout in use (shared or separate).",
            ["layout"],
            registry=r,
        )
        # --- models on demand (router.lanes.models) ---------------------------------------
        self.model_state = Gauge(
            "speclane_model_state",
            "1 for each servable model's current state (unloaded, loading, loaded, failed).",
            ["model", "state"],
            registry=r,
        )
        self.model_loads = Counter(
            "speclane_model_loads_total",
            "Model loads, by outcome (loaded, failed, memory_busy).",
            ["model", "outcome"],
            registry=r,
        )
        self.model_unloads = Counter(
            "speclane_model_unloads_total",
            "Model unloads, by reason (ttl, memory, keep_alive, shutdown).",
            ["model", "reason"],
            registry=r,
        )
        self.model_load_seconds = Histogram(
            "speclane_model_load_seconds",
            "Seconds from a load's start to its lanes being ready (successful loads).",
            ["model"],
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        self.worker_given_up = Gauge(
            "speclane_worker_given_up",
            "1 when the supervisor stopped restarting a lane's worker that kept dying.",
            ["lane"],
            registry=r,
        )

        self.prompt_cache_tokens = Counter(
            "speclane_prompt_cache_tokens_total",
            "Prompt tokens of lane requests, by kind: reused from the lane's prompt cache, or "
            "prefilled. Hit rate in tokens: reused / (reused + prefilled).",
            ["lane", "kind"],
            registry=r,
        )
        self.prompt_cache_lookups = Counter(
            "speclane_prompt_cache_lookups_total",
            "Prompt-cache lookups of lane requests, by result (hit: some prefix reused).",
            ["lane", "result"],
            registry=r,
        )
        self.prompt_cache_bytes = Gauge(
            "speclane_prompt_cache_bytes",
            "Bytes held by the lane's prompt cache.",
            ["lane"],
            registry=r,
        )
        self.prompt_cache_disk = Counter(
            "speclane_prompt_cache_disk_total",
            "The prompt cache's disk tier, by event: hits (a lookup read a longer prefix from "
            "disk), writes, dropped (the writer was behind), refused (a corrupt or foreign "
            "file dropped), evicted (past the disk bound).",
            ["lane", "event"],
            registry=r,
        )
        self.prompt_cache_disk_bytes = Gauge(
            "speclane_prompt_cache_disk_bytes",
            "Bytes of the prompt cache's files on disk, as the lane's worker sees them.",
            ["lane"],
            registry=r,
        )

        # --- classification and policy -------------------------------------------------
        self.decisions = Counter(
            "speclane_decisions_total",
            "Routing decisions by client, lane and reason.",
            [CLIENT_LABEL, "lane", "reason"],
            registry=r,
        )
        self.queue_depth = Gauge(
            "speclane_queue_depth",
            "Requests waiting for a client's concurrency slot.",
            [CLIENT_LABEL],
            registry=r,
        )
        self.queue_wait = Histogram(
            "speclane_queue_wait_seconds",
            "Time requests waited for a concurrency slot.",
            [CLIENT_LABEL],
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        self.rejections = Counter(
            "speclane_rejections_total",
            "Requests refused before routing (429 queue timeout, 401, 403), by client.",
            [CLIENT_LABEL, "status"],
            registry=r,
        )
        self.prefix_breaks = Counter(
            "speclane_prefix_breaks_total",
            "Chat requests whose prompt held a known prefix breaker (a line an agent program "
            "changes between conversations or turns), by client and reason: the "
            "normalisation rule that rendered it out of the way (router.proxy.normalise), or "
            "cache_short: its lane read less from its cache than the conversation's previous "
            "request left there (router.routing.prefixwatch).",
            [CLIENT_LABEL, "reason"],
            registry=r,
        )
        self.policy_reloads = Counter(
            "speclane_policy_reloads_total",
            "Policy reloads by result: ok, error, or held (would widen access; see SIGHUP).",
            ["result"],
            registry=r,
        )

        # --- speculative telemetry ----------------------------------------------------
        spec_labels = ["backend", "model", "workload", "source"]
        self.spec_draft_tokens = Counter(
            "speclane_spec_draft_tokens_total", "Draft tokens proposed.", spec_labels, registry=r
        )
        self.spec_accepted_tokens = Counter(
            "speclane_spec_accepted_tokens_total",
            "Draft tokens accepted by the target.",
            spec_labels,
            registry=r,
        )
        self.spec_rejected_tokens = Counter(
            "speclane_spec_rejected_tokens_total",
            "Draft tokens rejected by the target.",
            spec_labels,
            registry=r,
        )
        self.spec_source_tokens = Counter(
            "speclane_spec_source_tokens_total",
            "Draft tokens by draft source (speclane's lanes: draft_model, prompt_lookup, "
            "suffix, prediction; other backends: their kind), outcome drafted or accepted.",
            ["backend", "model", "source", "outcome"],
            registry=r,
        )
        self.spec_ignored_tokens = Counter(
            "speclane_spec_ignored_tokens_total",
            "Draft tokens neither accepted nor rejected (e.g. past a stop).",
            spec_labels,
            registry=r,
        )
        self.spec_acceptance_ratio = Gauge(
            "speclane_spec_acceptance_ratio",
            "Accepted / drafted over the sliding window.",
            spec_labels,
            registry=r,
        )
        self.spec_enabled = Gauge(
            "speclane_spec_enabled",
            "1 while speculation is used for the workload, 0 while auto-disabled.",
            spec_labels,
            registry=r,
        )
        self.spec_state_changes = Counter(
            "speclane_spec_state_changes_total",
            "Auto-disable state changes, by new state and reason.",
            [*spec_labels, "state", "reason"],
            registry=r,
        )
        self.spec_probes = Counter(
            "speclane_spec_probes_total",
            "Probe requests sent through speculation while off.",
            spec_labels,
            registry=r,
        )
        self.spec_telemetry_unavailable = Counter(
            "speclane_spec_telemetry_unavailable_total",
            "Responses without usable speculative statistics (not_reported or malformed).",
            ["backend", "reason"],
            registry=r,
        )
        self.spec_counter_resets = Counter(
            "speclane_spec_counter_resets_total",
            "Scraped speculative counters that went down: the backend restarted.",
            ["backend"],
            registry=r,
        )
        self.decode_tps = Histogram(
            "speclane_decode_tokens_per_second",
            "Per-request decode speed (output tokens after the first / time after the first).",
            ["lane", "speculative"],
            buckets=TOKS_BUCKETS,
            registry=r,
        )

        # --- capability gating ----------------------------------------------------------
        self.spec_requested = Gauge(
            "speclane_spec_requested",
            "1 when speculation is configured for the lane/backend.",
            ["backend"],
            registry=r,
        )
        self.spec_active = Gauge(
            "speclane_spec_active",
            "1 when speculation is actually running on the lane.",
            ["backend"],
            registry=r,
        )
        self.spec_observed = Gauge(
            "speclane_spec_observed",
            "1 when draft counts were observed from the backend in the recent window, 0 when a "
            "backend that can report them did not, -1 when its kind cannot report them.",
            ["backend"],
            registry=r,
        )

    def render(self, *, without: str | None = None) -> bytes:
        """The exposition; ``without``: a label left out of every series, the series that
        differed only by it summed (counters, gauges and histogram buckets alike add up)."""
        if without is None:
            return generate_latest(self.registry)
        return generate_latest(_WithoutLabel(self.registry, without))


class _WithoutLabel:
    """A registry's families with one label summed away (``Metrics.render(without=...)``)."""

    def __init__(self, registry: CollectorRegistry, label: str) -> None:
        self.registry = registry
        self.label = label

    def collect(self) -> Iterator[Metric]:
        for family in self.registry.collect():
            if not any(self.label in sample.labels for sample in family.samples):
                yield family
                continue
            merged: dict[tuple[str, tuple[tuple[str, str], ...]], float] = {}
            for sample in family.samples:
                kept = tuple((k, v) for k, v in sample.labels.items() if k != self.label)
                key, value = (sample.name, kept), sample.value
                if key not in merged:
                    merged[key] = value
                elif sample.name.endswith("_created"):  # a time: the earliest, not a sum
                    merged[key] = min(merged[key], value)
                else:
                    merged[key] += value
            out = Metric(family.name, family.documentation, family.type, family.unit)
            out.samples = [
                Sample(name, dict(kept), value) for (name, kept), value in merged.items()
            ]
            yield out
