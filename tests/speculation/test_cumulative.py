"""Cumulative counters: Prometheus text, vllm-mlx /v1/status, differencing and restarts."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from router.speculation.cumulative import (
    CounterDiffer,
    CounterKey,
    CounterSample,
    parse_prometheus_spec,
    parse_vllm_mlx_status,
)
from router.speculation.record import Malformed, SpecRecord
from tests.fuzzing import examples

MODEL = "Qwen/Qwen3-8B"


def vllm_metrics(
    drafts: int, draft_tokens: int, accepted: int, per_pos: tuple[int, ...], engines: int = 1
) -> str:
    """A /metrics page as vLLM's prometheus_client renders it (each engine gets a share)."""
    lines = [
        "# HELP vllm:num_requests_running Number of requests in model execution batches.",
        "# TYPE vllm:num_requests_running gauge",
        f'vllm:num_requests_running{{engine="0",model_name="{MODEL}"}} 1.0',
    ]
    families = [
        ("num_drafts", drafts),
        ("num_draft_tokens", draft_tokens),
        ("num_accepted_tokens", accepted),
    ]
    for what, total in families:
        name = f"vllm:spec_decode_{what}"
        lines += [f"# HELP {name}_total Spec decode counter.", f"# TYPE {name}_total counter"]
        for e in range(engines):
            share = total // engines + (total % engines if e == 0 else 0)
            lines.append(f'{name}_total{{engine="{e}",model_name="{MODEL}"}} {float(share)}')
            lines.append(f'{name}_created{{engine="{e}",model_name="{MODEL}"}} 1.77e+09')
    name = "vllm:spec_decode_num_accepted_tokens_per_pos"
    lines += [
        f"# HELP {name}_total Accepted tokens per draft position.",
        f"# TYPE {name}_total counter",
    ]
    for pos, total in enumerate(per_pos):
        for e in range(engines):
            share = total // engines + (total % engines if e == 0 else 0)
            lines.append(
                f'{name}_total{{engine="{e}",model_name="{MODEL}",position="{pos}"}} {share}.0'
            )
    return "\n".join(lines) + "\n"


def test_vllm_counters_summed_over_engines() -> None:
    samples = parse_prometheus_spec(vllm_metrics(1520, 4560, 2870, (1210, 960, 700), engines=2))
    assert samples == {
        CounterKey("vllm", MODEL, "spec_decode"): CounterSample(
            kind="draft", drafted=4560, accepted=2870, steps=1520, per_position=(1210, 960, 700)
        ),
    }


LLAMACPP = """\
# HELP llamacpp:prompt_tokens_total Number of prompt tokens processed.
# TYPE llamacpp:prompt_tokens_total counter
llamacpp:prompt_tokens_total 4021
# HELP llamacpp:spec_decode_num_drafts Number of speculative drafts.
# TYPE llamacpp:spec_decode_num_drafts counter
llamacpp:spec_decode_num_drafts 210
llamacpp:spec_decode_num_draft_tokens 1680
llamacpp:spec_decode_num_accepted_tokens 950
llamacpp:spec_decode_num_accepted_tokens_per_pos{position="1"} 300
llamacpp:spec_decode_num_accepted_tokens_per_pos{position="0"} 650
"""


def test_llamacpp_counters_without_total_suffix() -> None:
    assert parse_prometheus_spec(LLAMACPP) == {
        CounterKey("llamacpp", "", "spec_decode"): CounterSample(
            kind="draft", drafted=1680, accepted=950, steps=210, per_position=(650, 300)
        ),
    }


def test_both_spellings_of_one_counter_count_once() -> None:
    text = LLAMACPP + "llamacpp:spec_decode_num_draft_tokens_total 1680\n"
    sample = parse_prometheus_spec(text)[CounterKey("llamacpp", "", "spec_decode")]
    assert sample.drafted == 1680


def test_unreadable_lines_are_skipped_not_fatal() -> None:
    text = "\n".join(
        [
            'vllm:spec_decode_num_drafts_total{model_name="a"} NaN',
            'vllm:spec_decode_num_draft_tokens_total{model_name="a"} lots',
            'vllm:spec_decode_num_accepted_tokens_total{model_name="a"} -3',
            'vllm:spec_decode_num_draft_tokens_total{model_name="a \\"quoted\\", b"} 12 '
            "1771660000000",
            'vllm:spec_decode_num_accepted_tokens_per_pos_total{model_name="a",position="x"} 4',
            "garbage line",
        ]
    )
    assert parse_prometheus_spec(text) == {
        CounterKey("vllm", 'a "quoted", b', "spec_decode"): CounterSample(
            kind="draft", drafted=12, accepted=None, steps=None
        ),
    }


@pytest.mark.parametrize(
    ("escaped", "model"),
    [
        ("C:\\\\new", "C:\\new"),  # an escaped backslash then "n": not a line end
        ("a\\nb", "a\nb"),  # an escaped line end
        ('say \\"hi\\"', 'say "hi"'),
        ('\\\\\\"', '\\"'),
    ],
)
def test_escaped_label_values(escaped: str, model: str) -> None:
    text = f'vllm:spec_decode_num_draft_tokens_total{{model_name="{escaped}"}} 7\n'
    assert parse_prometheus_spec(text) == {
        CounterKey("vllm", model, "spec_decode"): CounterSample(
            kind="draft", drafted=7, accepted=None, steps=None
        )
    }


def test_one_series_per_model() -> None:
    text = (
        'vllm:spec_decode_num_draft_tokens_total{model_name="a"} 10\n'
        'vllm:spec_decode_num_draft_tokens_total{model_name="b"} 20\n'
    )
    drafted = {k.model: v.drafted for k, v in parse_prometheus_spec(text).items()}
    assert drafted == {"a": 10, "b": 20}


def test_vllm_mlx_status_blocks() -> None:
    status = {
        "status": "ok",
        "model": "mlx-community/GLM-5-4bit",
        "mtp": {
            "enabled": True,
            "attempted": 50,
            "accepted": 0,
            "rejected": 50,
            "errors": 0,
            "acceptance_rate": 0.0,
        },
        "spec_decode": {
            "enabled": True,
            "method": "mtp",
            "k": 1,
            "total_drafts": 50,
            "total_draft_tokens": 50,
            "total_accepted": 0,
            "acceptance_rate": 0.0,
            "recent_acceptance_rate": 0.0,
            "auto_disabled": True,
        },
    }
    samples = parse_vllm_mlx_status(status)
    model = "mlx-community/GLM-5-4bit"
    assert samples[CounterKey("vllm_mlx", model, "mtp")] == CounterSample(
        kind="mtp", drafted=50, accepted=0, rejected=50
    )
    assert samples[CounterKey("vllm_mlx", model, "spec_decode")] == CounterSample(
        kind="mtp", drafted=50, accepted=0, steps=50
    )


def test_vllm_mlx_status_nested_disabled_or_missing() -> None:
    nested = {
        "engine": {
            "spec_decode": {"total_drafts": 3, "total_draft_tokens": 12, "total_accepted": 6}
        }
    }
    assert parse_vllm_mlx_status(nested) == {
        CounterKey("vllm_mlx", "", "spec_decode"): CounterSample("draft", 12, 6, steps=3)
    }
    assert parse_vllm_mlx_status({"mtp": {"enabled": False, "attempted": 1, "accepted": 1}}) == {}
    assert parse_vllm_mlx_status({"mtp": {"attempted": "x", "accepted": 1}}) == {}
    assert parse_vllm_mlx_status(["not", "a", "dict"]) == {}


KEY = CounterKey("vllm", MODEL, "spec_decode")


def sample(drafted: int, accepted: int, steps: int, per_pos: tuple[int, ...] = ()) -> CounterSample:
    return CounterSample("draft", drafted, accepted, steps, per_position=per_pos)


def test_first_scrape_only_sets_the_baseline_then_deltas() -> None:
    differ = CounterDiffer()
    assert differ.update({KEY: sample(300, 150, 100, (80, 50, 20))}) == []
    (delta,) = differ.update({KEY: sample(390, 210, 130, (105, 70, 35))})
    assert not delta.restarted
    r = delta.result
    assert isinstance(r, SpecRecord)
    assert (r.scope, r.source, r.drafted, r.accepted, r.rejected, r.steps) == (
        "cumulative",
        "vllm",
        90,
        60,
        30,
        30,
    )
    assert r.per_position == (25, 20, 15)
    assert r.mean_accept_len == 3.0


def test_idle_interval_gives_no_record() -> None:
    differ = CounterDiffer()
    differ.update({KEY: sample(300, 150, 100)})
    (delta,) = differ.update({KEY: sample(300, 150, 100)})
    assert delta.result is None and not delta.restarted


def test_a_counter_going_down_is_a_restart_and_counts_from_zero() -> None:
    differ = CounterDiffer()
    differ.update({KEY: sample(3000, 1500, 1000, (800, 500, 200))})
    (delta,) = differ.update({KEY: sample(40, 30, 10, (15, 10, 5))})
    assert delta.restarted
    assert isinstance(delta.result, SpecRecord)
    assert (delta.result.drafted, delta.result.accepted, delta.result.steps) == (40, 30, 10)
    assert delta.result.per_position == (15, 10, 5)
    # The next interval differences against the post-restart values again.
    (after,) = differ.update({KEY: sample(70, 50, 20, (25, 17, 8))})
    assert not after.restarted and isinstance(after.result, SpecRecord)
    assert after.result.drafted == 30


def test_restart_back_to_zero_is_reported_without_a_record() -> None:
    differ = CounterDiffer()
    differ.update({KEY: sample(300, 150, 100)})
    (delta,) = differ.update({KEY: sample(0, 0, 0)})
    assert delta.restarted and delta.result is None


def test_an_impossible_delta_is_malformed() -> None:
    differ = CounterDiffer()
    differ.update({KEY: sample(300, 150, 100)})
    (delta,) = differ.update({KEY: sample(310, 200, 103)})  # 50 accepted of 10 drafted
    assert isinstance(delta.result, Malformed) and delta.result.reason == "inconsistent"


def test_a_counter_first_seen_late_has_no_baseline() -> None:
    differ = CounterDiffer()
    differ.update({KEY: CounterSample("draft", None, None)})
    (delta,) = differ.update({KEY: sample(300, 150, 100)})
    assert delta.result is None


def test_remembered_series_are_bounded_and_forgettable() -> None:
    differ = CounterDiffer(max_series=2)
    for model in "abc":
        differ.update({CounterKey("vllm", model, "spec_decode"): sample(1, 1, 1)})
    assert len(differ._last) == 2
    differ.forget("vllm")
    assert not differ._last


@settings(max_examples=examples(300), deadline=None)
@given(st.text(alphabet=st.characters(codec="utf-8"), max_size=300))
def test_any_text_parses_without_raising(text: str) -> None:
    parse_prometheus_spec(text)
    parse_prometheus_spec("vllm:spec_decode_num_draft_tokens_total{" + text + "} 1\n" + text)


opt_count = st.one_of(st.none(), st.integers(0, 1000))
samples = st.builds(
    CounterSample,
    kind=st.sampled_from(["draft", "mtp"]),
    drafted=opt_count,
    accepted=opt_count,
    steps=opt_count,
    rejected=opt_count,
    per_position=st.lists(st.integers(0, 1000), max_size=4).map(tuple),
)


@settings(max_examples=examples(300), deadline=None)
@given(st.lists(samples, min_size=1, max_size=8))
def test_differ_never_raises_and_never_emits_negative_counts(sequence: list) -> None:
    differ = CounterDiffer()
    for s in sequence:
        for delta in differ.update({KEY: s}):
            r = delta.result
            assert (
                r is None
                or isinstance(r, Malformed)
                or (
                    min(r.drafted, r.accepted, r.rejected, r.ignored) >= 0
                    and all(n >= 0 for n in r.per_position)
                )
            )
