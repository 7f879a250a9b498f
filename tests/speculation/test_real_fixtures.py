"""The statistics parsers and cumulative scrapers on bytes captured from real servers.

Every file of tests/fixtures/real-backends is read here (a new file without a row fails
``test_every_fixture_is_covered``), each with the figures it contains: what its README
says, cross-checked for llama.cpp against the last ``draft_n`` / ``draft_n_accepted`` found
in the raw bytes by a plain regex, independent of the parsers.
"""

from __future__ import annotations

import re
from typing import Any

import aiohttp
import orjson
import pytest

from router.backends.base import Backend
from router.backends.pool import BackendPool
from router.backends.scrape import CumulativeScraper
from router.config.settings import BackendSpec, CooldownSettings
from router.kernel.sse import SSETail
from router.speculation.cumulative import (
    CounterDelta,
    parse_prometheus_spec,
    parse_vllm_mlx_status,
)
from router.speculation.parsers import output_tokens, parse_response, parse_stream_events
from router.speculation.record import NotReported, SpecRecord
from tests.fakes.replay import FIXTURES, Capture, ReplayUpstream, load

# file -> (backend kind, (drafted, accepted) or the NotReported reason, output tokens)
ANSWERS: dict[str, tuple[str, tuple[int, int] | str, int | None]] = {
    "llamacpp-server_draftQ2K_chat_nonstream.http": ("llamacpp", (40, 29), 40),
    "llamacpp-server_draftQ2K_chat_stream_include-usage.sse": ("llamacpp", (20, 14), 20),
    "llamacpp-server_draftQ2K_chat_stream_no-include-usage.http": ("llamacpp", (36, 30), 40),
    # timings grow on every chunk: the last one is the whole answer's
    "llamacpp-server_draftQ2K_chat_stream_timings_per_token.sse": ("llamacpp", (13, 7), 12),
    "llamacpp-server_draftQ2K_completions_nonstream.json": ("llamacpp", (40, 18), 30),
    "llamacpp-server_draftQ2K_completions_stream.sse": ("llamacpp", (40, 18), 30),
    "llamacpp-server_plain_chat_nonstream.http": ("llamacpp", "no_draft", 30),
    "llamacpp-server_plain_chat_stream.http": ("llamacpp", "no_draft", 30),
    "mlxlm-0.32.2_draft3_chat_nonstream.http": ("mlx_lm", "not_supported", 8),
    "mlxlm-0.32.2_draft3_chat_stream.http": ("mlx_lm", "not_supported", 8),
    "mlxlm-0.32.2_draft3_repeat-prompt-bug_nonstream.json": ("mlx_lm", "not_supported", 1),
    "mlxlm-0.32.2_draft3_repeat-prompt-bug_stream.sse": ("mlx_lm", "not_supported", 1),
    "mlxlm-0.32.2_plain_chat_nonstream.http": ("mlx_lm", "not_supported", 8),
    "mlxlm-0.32.2_plain_chat_stream.http": ("mlx_lm", "not_supported", 8),
    "vllm-mlx-0.6.0_cb-mtp-ignored_chat_nonstream.json": ("vllm_mlx", "no_draft", 8),
    "vllm-mlx-0.6.0_plain_chat_nonstream.http": ("vllm_mlx", "no_draft", 7),
    "vllm-mlx-0.6.0_plain_chat_stream.http": ("vllm_mlx", "no_draft", 8),
    # llama-cpp-python: no timings, no usage in streams
    "llama-cpp-python-0.3.36_plain_chat_nonstream.http": ("openai", "absent", 30),
    "llama-cpp-python-0.3.36_plain_chat_stream.http": ("openai", "absent", None),
    "llama-cpp-python-0.3.36_prompt-lookup_chat_nonstream.json": ("openai", "absent", 7),
    "llama-cpp-python-0.3.36_prompt-lookup_chat_stream.sse": ("openai", "absent", None),
}
# file -> (drafted, accepted, drafts, per position) of its one spec_decode series, or None
PROMETHEUS: dict[str, tuple[int, int, int, tuple[int, ...]] | None] = {
    "llamacpp-server_metrics_draftQ2K.txt": (96, 73, 24, (21, 21, 16, 15)),
    "llamacpp-server_metrics_plain.txt": (0, 0, 0, ()),
    "vllm-mlx-0.6.0_metrics.txt": None,  # no speculative counters without MTP
}
STATUS = ("vllm-mlx-0.6.0_v1-status_plain.json", "vllm-mlx-0.6.0_v1-status_cb-mtp-ignored.json")
OTHERS = {  # read by other tests
    "README.md",
    "llamacpp-server_metrics_without--metrics.http",  # below, and test_errors
    "llamacpp-server_v1-models.json",
    "llama-cpp-python-0.3.36_v1-models.json",
    "vllm-mlx-0.6.0_v1-models.json",
    "mlxlm-0.32.2_v1-models.http",
    "mlxlm-0.32.2_v1-models_no-hf-cache.http",  # tests/backends/test_health.py
}


def test_every_fixture_is_covered() -> None:
    files = {p.name for p in FIXTURES.iterdir()}
    assert files == set(ANSWERS) | set(PROMETHEUS) | set(STATUS) | OTHERS


def events(cap: Capture) -> tuple[list[dict[str, Any]], bool]:
    tail = SSETail()
    tail.feed(cap.body)
    found, malformed, done = tail.finish()
    assert malformed == 0
    return found, done


def last_llamacpp_counts(raw: bytes) -> tuple[int, int] | None:
    drafted = re.findall(rb'"draft_n":(\d+)', raw)
    accepted = re.findall(rb'"draft_n_accepted":(\d+)', raw)
    return (int(drafted[-1]), int(accepted[-1])) if drafted else None


@pytest.mark.parametrize("name", sorted(ANSWERS))
def test_statistics_of_every_captured_answer(name: str) -> None:
    kind, expected, tokens = ANSWERS[name]
    cap = load(name)
    assert cap.status == 200
    if "text/event-stream" in cap.content_type:
        found, done = events(cap)
        assert done  # every captured stream ends with data: [DONE]
        result = parse_stream_events(kind, found)
        counted = next((n for e in reversed(found) if (n := output_tokens(e)) is not None), None)
    else:
        body = orjson.loads(cap.body)
        result = parse_response(kind, body)
        counted = output_tokens(body)
    assert counted == tokens
    if isinstance(expected, tuple):
        assert isinstance(result, SpecRecord), result
        assert (result.drafted, result.accepted) == expected
        assert result.rejected == expected[0] - expected[1] and result.kind == "draft"
        assert last_llamacpp_counts(cap.body) == expected
        # "openai" (a generic OpenAI server) reads llama.cpp's timings too
        generic = (
            parse_stream_events("openai", events(cap)[0])
            if "text/event-stream" in cap.content_type
            else parse_response("openai", orjson.loads(cap.body))
        )
        assert isinstance(generic, SpecRecord) and generic.drafted == expected[0]
    else:
        assert result == NotReported(kind, expected)
        if kind == "llamacpp":
            assert last_llamacpp_counts(cap.body) is None


@pytest.mark.parametrize("name", sorted(PROMETHEUS))
def test_cumulative_counters_of_every_captured_metrics_page(name: str) -> None:
    parsed = parse_prometheus_spec(load(name).body.decode())
    expected = PROMETHEUS[name]
    if expected is None:
        assert parsed == {}
        return
    (sample,) = parsed.values()
    drafted, accepted, drafts, per_position = expected
    assert (sample.drafted, sample.accepted, sample.steps, sample.per_position) == (
        drafted,
        accepted,
        drafts,
        per_position,
    )
    assert sum(per_position) == accepted


@pytest.mark.parametrize("name", STATUS)
def test_vllm_mlx_status_without_mtp_has_no_counters(name: str) -> None:
    payload = orjson.loads(load(name).body)
    assert payload["mtp"]["enabled"] is False
    assert parse_vllm_mlx_status(payload) == {}


async def test_scraper_differences_llama_server_counters_and_skips_a_501() -> None:
    """The scraper on llama-server's pages: plain (zeros), then the draft run's counters,
    then a server without --metrics (501): nothing, and no error."""
    plain, draft = (
        load("llamacpp-server_metrics_plain.txt"),
        load("llamacpp-server_metrics_draftQ2K.txt"),
    )
    async with (
        ReplayUpstream(Capture(404, "text/plain", b""), gets={"/metrics": plain}) as up,
        aiohttp.ClientSession() as s,
    ):
        spec = BackendSpec(name="llama", kind="llamacpp", base_url=up.base_url)
        pool = BackendPool([Backend.from_spec(spec, CooldownSettings())])
        seen: list[list[CounterDelta]] = []
        scraper = CumulativeScraper(pool, s, 60, lambda _b, d: seen.append(d))
        assert [b.name for b in scraper.targets()] == ["llama"]
        await scraper.scrape(pool["llama"])  # the first sample: a baseline
        up.gets["/metrics"] = draft
        await scraper.scrape(pool["llama"])
        up.gets["/metrics"] = load("llamacpp-server_metrics_without--metrics.http")
        await scraper.scrape(pool["llama"])
    results = [d.result for deltas in seen for d in deltas if isinstance(d.result, SpecRecord)]
    assert len(results) == 1
    (result,) = results
    assert (result.drafted, result.accepted, result.steps) == (96, 73, 24)
    assert result.per_position == (21, 21, 16, 15)
    assert not any(d.restarted for deltas in seen for d in deltas)
