"""Cumulative draft counters (Prometheus ``/metrics``, vllm-mlx ``/v1/status``), pure.

Some backends only keep running totals. The scraper (I/O, not here) fetches them every
``scrape_interval``; ``parse_prometheus_spec`` / ``parse_vllm_mlx_status`` turn one scrape
into ``CounterSample``s, and ``CounterDiffer`` turns successive scrapes into delta
``SpecRecord``s (scope ``cumulative``). A counter that went down means the backend
restarted: the delta is then the new value (its counters started again at zero), and the
restart is reported so the caller can log and count it. A restart followed by more
activity than before it, all between two scrapes, cannot be seen; the scrape interval
keeps that window short.
"""

from __future__ import annotations

import math
import re
from collections import OrderedDict
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from prometheus_client.parser import text_string_to_metric_families

from router.speculation.record import Malformed, SpecKind, SpecRecord, build_record


class CounterKey(NamedTuple):
    source: str  # "vllm", "llamacpp", "vllm_mlx"
    model: str  # the model_name label, "" when the backend does not label by model
    series: str  # the counter family: "spec_decode" or "mtp"


@dataclass(frozen=True, slots=True)
class CounterSample:
    """Running totals at one scrape; None where the backend does not export the counter."""

    kind: SpecKind
    drafted: int | None
    accepted: int | None
    steps: int | None = None
    rejected: int | None = None
    per_position: tuple[int, ...] = field(default=())


# --- Prometheus text exposition -------------------------------------------------------

_SPEC = re.compile(r"^(?P<source>vllm|llamacpp):spec_decode_(?P<what>[a-z_]+?)(?:_total)?$")
_FIELDS = {
    "num_drafts": "steps",
    "num_draft_tokens": "drafted",
    "num_accepted_tokens": "accepted",
    "num_accepted_tokens_per_pos": "per_position",
}


def parse_prometheus_spec(text: str) -> dict[CounterKey, CounterSample]:
    """The vLLM / llama.cpp ``spec_decode`` counters of one ``/metrics`` scrape.

    Accepts names with or without ``_total``, sums over labels other than ``model_name``
    and ``position`` (vLLM's ``engine``: one series per data-parallel engine), and skips
    lines it cannot read rather than failing the scrape.
    """
    totals: dict[tuple[str, str], dict[str, Any]] = {}
    seen_total: set[tuple[str, str, str, str]] = set()
    for name, labels, value in _spec_samples(text):
        spec = _SPEC.match(name)
        if spec is None or spec["what"] not in _FIELDS:
            continue
        # A server exposing both spellings of one counter must not count it twice.
        spelling = (
            spec["source"],
            spec["what"],
            repr(sorted(labels.items())),
            "total" if name.endswith("_total") else "bare",
        )
        twin = (*spelling[:3], "bare" if spelling[3] == "total" else "total")
        if twin in seen_total:
            continue
        seen_total.add(spelling)
        target = _FIELDS[spec["what"]]
        pos = _position(labels) if target == "per_position" else None
        if target == "per_position" and pos is None:
            continue
        slot = totals.setdefault((spec["source"], labels.get("model_name", "")), {})
        if pos is not None:
            per = slot.setdefault("per_position", {})
            per[pos] = per.get(pos, 0) + value
        else:
            slot[target] = slot.get(target, 0) + value
    return {
        CounterKey(source, model, "spec_decode"): CounterSample(
            kind="draft",
            drafted=got.get("drafted"),
            accepted=got.get("accepted"),
            steps=got.get("steps"),
            per_position=_dense(got.get("per_position", {})),
        )
        for (source, model), got in totals.items()
    }


def _spec_samples(text: str) -> Iterator[tuple[str, dict[str, str], int]]:
    """``(name, labels, value)`` of the ``spec_decode`` samples, read by prometheus_client's
    parser one line at a time: a line it cannot read is skipped, not the whole scrape (the
    parser gives up at the first bad line, and a backend's other metrics are not ours to
    judge). Values that are not finite non-negative numbers are skipped too."""
    for line in text.splitlines():
        if "spec_decode" not in line or line.lstrip().startswith("#"):
            continue
        try:
            families = list(text_string_to_metric_families(line + "\n"))
        except (ValueError, IndexError, KeyError, TypeError):
            continue
        for family in families:
            for sample in family.samples:
                value = sample.value
                if isinstance(value, int | float) and math.isfinite(value) and value >= 0:
                    yield sample.name, dict(sample.labels), round(value)


def _position(labels: Mapping[str, str]) -> int | None:
    try:
        pos = int(labels.get("position", ""))
    except ValueError:
        return None
    return pos if 0 <= pos < 4096 else None


def _dense(per: Mapping[int, int]) -> tuple[int, ...]:
    if not per:
        return ()
    return tuple(per.get(i, 0) for i in range(max(per) + 1))


# --- vllm-mlx GET /v1/status ------------------------------------------------------------


def parse_vllm_mlx_status(payload: Any) -> dict[CounterKey, CounterSample]:
    """The ``mtp`` and (unmerged builds) ``spec_decode`` blocks of vllm-mlx ``/v1/status``.

    Blocks are looked for at the top level and one level down; a block that is disabled,
    malformed or absent is left out (the caller sees an empty dict).
    """
    if not isinstance(payload, Mapping):
        return {}
    model = payload.get("model")
    model = model if isinstance(model, str) else ""
    out: dict[CounterKey, CounterSample] = {}
    for series, reader in (("mtp", _mtp_block), ("spec_decode", _spec_decode_block)):
        block = _find_block(payload, series)
        sample = reader(block) if block is not None else None
        if sample is not None:
            out[CounterKey("vllm_mlx", model, series)] = sample
    return out


def _find_block(payload: Mapping[str, Any], name: str) -> Mapping[str, Any] | None:
    block = payload.get(name)
    if isinstance(block, Mapping):
        return block
    for value in payload.values():
        if isinstance(value, Mapping) and isinstance(value.get(name), Mapping):
            return value[name]
    return None


def _mtp_block(block: Mapping[str, Any]) -> CounterSample | None:
    if block.get("enabled") is False:
        return None
    drafted, accepted = _int(block.get("attempted")), _int(block.get("accepted"))
    if drafted is None or accepted is None:
        return None
    return CounterSample(
        kind="mtp", drafted=drafted, accepted=accepted, rejected=_int(block.get("rejected"))
    )


def _spec_decode_block(block: Mapping[str, Any]) -> CounterSample | None:
    if block.get("enabled") is False:
        return None
    drafted, accepted = _int(block.get("total_draft_tokens")), _int(block.get("total_accepted"))
    if drafted is None or accepted is None:
        return None
    kind: SpecKind = "mtp" if block.get("method") == "mtp" else "draft"
    return CounterSample(
        kind=kind, drafted=drafted, accepted=accepted, steps=_int(block.get("total_drafts"))
    )


def _int(value: Any) -> int | None:
    if isinstance(value, bool):
        return None
    if isinstance(value, float) and math.isfinite(value) and value.is_integer():
        value = int(value)
    return value if isinstance(value, int) and value >= 0 else None


# --- differencing --------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class CounterDelta:
    """What happened on one counter series since the previous scrape.

    ``result`` is None when nothing was drafted in the interval (idle backend).
    """

    key: CounterKey
    result: SpecRecord | Malformed | None
    restarted: bool


class CounterDiffer:
    """Successive scrapes -> delta records. Remembers the last sample of each series.

    The first scrape of a series only sets its baseline (those totals may predate the
    router). At most ``max_series`` series are remembered, the least recently seen
    forgotten first.
    """

    def __init__(self, max_series: int = 64) -> None:
        self._last: OrderedDict[CounterKey, CounterSample] = OrderedDict()
        self._max = max_series

    def update(self, samples: Mapping[CounterKey, CounterSample]) -> list[CounterDelta]:
        deltas = []
        for key, sample in samples.items():
            previous = self._last.get(key)
            self._last[key] = sample
            self._last.move_to_end(key)
            if previous is not None:
                deltas.append(_delta(key, previous, sample))
        while len(self._last) > self._max:
            self._last.popitem(last=False)
        return deltas

    def forget(self, source: str) -> None:
        """Drop every series of a source (a backend removed from the configuration)."""
        for key in [k for k in self._last if k.source == source]:
            del self._last[key]


def _delta(key: CounterKey, old: CounterSample, new: CounterSample) -> CounterDelta:
    pairs = [
        (old.drafted, new.drafted),
        (old.accepted, new.accepted),
        (old.steps, new.steps),
        (old.rejected, new.rejected),
        *zip(old.per_position, new.per_position, strict=False),
    ]
    restarted = any(o is not None and n is not None and n < o for o, n in pairs) or (
        len(new.per_position) < len(old.per_position)
    )

    def diff(o: int | None, n: int | None) -> int | None:
        # A counter that was not exported last time has no baseline to subtract.
        if n is None or (o is None and not restarted):
            return None
        return n if restarted or o is None else n - o

    drafted = diff(old.drafted, new.drafted)
    if not drafted:
        return CounterDelta(key, None, restarted)
    per_position = tuple(
        diff(old.per_position[i] if i < len(old.per_position) else 0, n) or 0
        for i, n in enumerate(new.per_position)
    )
    result = build_record(
        key.source,
        "cumulative",
        new.kind,
        drafted=drafted,
        accepted=diff(old.accepted, new.accepted),
        rejected=diff(old.rejected, new.rejected),
        steps=diff(old.steps, new.steps),
        per_position=per_position if any(per_position) else (),
    )
    return CounterDelta(key, result, restarted)
