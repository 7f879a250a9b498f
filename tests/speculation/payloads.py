"""Response bodies and stream events shaped like each backend's own (backend-stats.md).

Builders return fresh dicts so a test may mutate them.
"""

from __future__ import annotations

from typing import Any

from router.kernel.worker_contract import STREAM_USAGE_FIELD

Json = dict[str, Any]


def _chat(model: str, content: str = "Paris is the capital of France.", **extra: Any) -> Json:
    return {
        "id": "chatcmpl-3f1a",
        "object": "chat.completion",
        "created": 1771660000,
        "model": model,
        "choices": [
            {
                "index": 0,
                "logprobs": None,
                "finish_reason": "stop",
                "message": {"role": "assistant", "content": content},
            }
        ],
        **extra,
    }


def _chunk(model: str, delta: Json, finish: str | None = None, **extra: Any) -> Json:
    return {
        "id": "chatcmpl-3f1a",
        "object": "chat.completion.chunk",
        "created": 1771660000,
        "model": model,
        "choices": [{"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}],
        **extra,
    }


def _usage_chunk(model: str, usage: Json, **extra: Any) -> Json:
    return {
        "id": "chatcmpl-3f1a",
        "object": "chat.completion.chunk",
        "created": 1771660000,
        "model": model,
        "choices": [],
        "usage": usage,
        **extra,
    }


def usage(prompt: int = 24, completion: int = 112, **extra: Any) -> Json:
    return {
        "prompt_tokens": prompt,
        "completion_tokens": completion,
        "total_tokens": prompt + completion,
        **extra,
    }


# --- LM Studio -----------------------------------------------------------------------------

LMS_STATS = {
    "total_draft_tokens_count": 150,
    "accepted_draft_tokens_count": 96,
    "rejected_draft_tokens_count": 50,
    "ignored_draft_tokens_count": 4,
}


def lmstudio_v1(stats: Json | None = None) -> Json:
    return _chat(
        "qwen2.5-7b-instruct",
        usage=usage(),
        stats=dict(LMS_STATS) if stats is None else stats,
        system_fingerprint="qwen2.5-7b-instruct",
    )


def lmstudio_api_v0() -> Json:
    """/api/v0: the counts in ``usage`` (no ignored), ``stats`` holds the clock."""
    return _chat(
        "qwen3.5-27b",
        usage=usage(
            66,
            300,
            completion_tokens_details={"reasoning_tokens": 300},
            total_draft_tokens_count=492,
            accepted_draft_tokens_count=176,
            rejected_draft_tokens_count=316,
        ),
        stats={
            "tokens_per_second": 17.92897117267284,
            "time_to_first_token": 1.162136,
            "generation_time": 17.839055000000002,
            "stop_reason": "maxPredictedTokensReached",
        },
        model_info={
            "arch": "qwen35",
            "quant": "Q8_K_XL",
            "format": "gguf",
            "context_length": 262144,
        },
        runtime={"name": "llama.cpp-mac-arm64-apple-metal-advsimd", "version": "2.34.0"},
    )


def lmstudio_stream(stats_on_usage_chunk: bool = True) -> list[Json]:
    model = "qwen2.5-7b-instruct"
    events = [
        _chunk(model, {"role": "assistant", "content": ""}),
        _chunk(model, {"content": "Paris"}),
    ]
    if stats_on_usage_chunk:
        events += [_chunk(model, {}, "stop"), _usage_chunk(model, usage(), stats=dict(LMS_STATS))]
    else:
        events += [_chunk(model, {}, "stop", stats=dict(LMS_STATS))]
    return events


# --- llama.cpp -----------------------------------------------------------------------------


def llamacpp_timings(**draft: int) -> Json:
    return {
        "prompt_n": 20,
        "prompt_ms": 120.5,
        "prompt_per_token_ms": 6.025,
        "prompt_per_second": 165.97,
        "predicted_n": 200,
        "predicted_ms": 4000.0,
        "predicted_per_token_ms": 20.0,
        "predicted_per_second": 50.0,
        **draft,
    }


def llamacpp_chat(drafted: bool = True) -> Json:
    draft = {"draft_n": 347, "draft_n_accepted": 65} if drafted else {}
    return _chat(
        "gpt-3.5-turbo",
        usage=usage(20, 200),
        system_fingerprint="b6100-1c2f",
        timings=llamacpp_timings(**draft),
    )


def llamacpp_completion() -> Json:
    """The native /completion endpoint."""
    return {
        "index": 0,
        "content": " The capital of France is Paris.",
        "tokens": [],
        "id_slot": 0,
        "stop": True,
        "model": "qwen2.5-7b",
        "tokens_predicted": 200,
        "tokens_evaluated": 20,
        "has_new_line": False,
        "truncated": False,
        "stop_type": "eos",
        "stopping_word": "",
        "tokens_cached": 219,
        "timings": llamacpp_timings(draft_n=120, draft_n_accepted=90),
    }


def llamacpp_stream(include_usage: bool, per_token_timings: bool = False) -> list[Json]:
    model = "gpt-3.5-turbo"
    early = {"timings": llamacpp_timings(draft_n=12, draft_n_accepted=3)}
    if not per_token_timings:
        early = {}
    final_timings = llamacpp_timings(draft_n=347, draft_n_accepted=65)
    events = [
        _chunk(model, {"role": "assistant", "content": None}),
        _chunk(model, {"content": "Paris"}, **early),
    ]
    if include_usage:
        events += [
            _chunk(model, {}, "stop"),
            _usage_chunk(model, usage(20, 200), timings=final_timings),
        ]
    else:
        events += [_chunk(model, {}, "stop", timings=final_timings)]
    return events


# --- vLLM ------------------------------------------------------------------------------------

VLLM_SPEC = {
    "num_draft_tokens": 120,
    "num_accepted_draft_tokens": 84,
    "num_spec_steps": 40,
    "draft_acceptance_rate": 0.7,
    "mean_acceptance_length": 3.1,
    "acceptance_histogram": {"0": 5, "1": 6, "2": 9, "3": 20},
}


def vllm_chat(spec: Json | None = None, metrics: bool = True) -> Json:
    extra: Json = {"usage": usage(30, 124), "prompt_logprobs": None, "kv_transfer_params": None}
    if metrics:
        extra["metrics"] = {"speculative_decoding": dict(VLLM_SPEC) if spec is None else spec}
    return _chat("Qwen/Qwen3-8B", **extra)


def vllm_stream(on_usage_chunk: bool) -> list[Json]:
    model = "Qwen/Qwen3-8B"
    metrics = {"speculative_decoding": dict(VLLM_SPEC)}
    events = [
        _chunk(model, {"role": "assistant", "content": ""}),
        _chunk(model, {"content": "Paris"}),
    ]
    if on_usage_chunk:
        events += [_chunk(model, {}, "stop"), _usage_chunk(model, usage(30, 124), metrics=metrics)]
    else:
        events += [_chunk(model, {}, "stop", metrics=metrics)]
    return events


# --- SGLang ---------------------------------------------------------------------------------


def sglang_openai(accepted: int = 90, rejected: int = 60) -> Json:
    return _chat(
        "meta-llama/Llama-3.1-8B-Instruct",
        usage=usage(
            40,
            150,
            prompt_tokens_details=None,
            completion_tokens_details={
                "reasoning_tokens": 0,
                "accepted_prediction_tokens": accepted,
                "rejected_prediction_tokens": rejected,
            },
        ),
    )


def sglang_generate() -> Json:
    return {
        "text": "result",
        "meta_info": {
            "id": "9d1e",
            "finish_reason": {"type": "length", "length": 1024},
            "prompt_tokens": 131,
            "completion_tokens": 1024,
            "cached_tokens": 0,
            "spec_verify_ct": 200,
            "spec_num_correct_drafts": 800,
            "spec_num_proposed_drafts": 1600,
            "spec_accept_rate": 0.5,
            "spec_accept_length": 5.0,
            "spec_correct_drafts_histogram": [10, 10, 20, 30, 40, 50, 30, 10],
            "e2e_latency": 3.2,
        },
    }


def sglang_generate_old() -> Json:
    return {
        "text": "result",
        "meta_info": {
            "id": "77aa",
            "finish_reason": {"type": "stop", "matched": 2},
            "prompt_tokens": 12,
            "completion_tokens": 350,
            "spec_verify_ct": 100,
            "spec_accept_token_num": 250,
            "spec_draft_token_num": 400,
        },
    }


def sglang_stream() -> list[Json]:
    model = "meta-llama/Llama-3.1-8B-Instruct"
    details = {
        "reasoning_tokens": 0,
        "accepted_prediction_tokens": 90,
        "rejected_prediction_tokens": 60,
    }
    return [
        _chunk(model, {"role": "assistant", "content": "Paris"}, usage=None),
        _chunk(model, {}, "stop", usage=None),
        _usage_chunk(model, usage(40, 150, completion_tokens_details=details)),
    ]


# --- vllm-mlx -------------------------------------------------------------------------------


def vllm_mlx_chat(meta: Json | str | None = "default") -> Json:
    body = _chat("mlx-community/Qwen3-Next-80B-A3B-Instruct-4bit", usage=usage(17, 81))
    default = {"mtp_drafts": 80, "mtp_accepted": 52}
    body["generation_metadata"] = default if meta == "default" else meta
    return body


# --- OpenAI ---------------------------------------------------------------------------------


def openai_predicted(accepted: int = 18, rejected: int = 10) -> Json:
    return _chat(
        "gpt-4o-2024-08-06",
        usage=usage(
            60,
            120,
            prompt_tokens_details={"cached_tokens": 0, "audio_tokens": 0},
            completion_tokens_details={
                "reasoning_tokens": 0,
                "audio_tokens": 0,
                "accepted_prediction_tokens": accepted,
                "rejected_prediction_tokens": rejected,
            },
        ),
        service_tier="default",
        system_fingerprint="fp_1c2d",
    )


# --- speclane's own worker ----------------------------------------------------------------


def speclane_usage(
    drafted: int = 90, accepted: int = 60, steps: int = 30, k: int = 3, prediction: int = 0
) -> Json:
    """``prediction``: the request sent one (only then OpenAI's prediction counts)."""
    u = usage(20, accepted + steps)
    if prediction:
        u["completion_tokens_details"] = {
            "accepted_prediction_tokens": accepted,
            "rejected_prediction_tokens": drafted - accepted,
        }
    u["speclane_spec"] = {
        "drafted": drafted,
        "accepted": accepted,
        "rejected": drafted - accepted,
        "steps": steps,
        "num_draft_tokens": k,
    }
    return u


def speclane_chat(**counts: int) -> Json:
    return _chat("SmolLM2-135M-Instruct", usage=speclane_usage(**counts))


def speclane_batching() -> Json:
    return _chat("SmolLM2-135M-Instruct", usage=speclane_usage(drafted=0, accepted=0, steps=0, k=0))


def speclane_stream(include_usage: bool) -> list[Json]:
    model = "SmolLM2-135M-Instruct"
    # Usage once, on the last chunk: the include_usage chunk, else (no usage for the client,
    # as OpenAI's) the finish_reason chunk's field of ours.
    events = [_chunk(model, {"role": "assistant", "content": "Paris"})]
    if include_usage:
        events += [_chunk(model, {}, "stop"), _usage_chunk(model, speclane_usage())]
    else:
        events.append(_chunk(model, {}, "stop", **{STREAM_USAGE_FIELD: speclane_usage()}))
    return events


# --- backends that report nothing -----------------------------------------------------------


def mlx_lm_chat() -> Json:
    return _chat(
        "mlx-community/Qwen2.5-7B-Instruct-4bit",
        usage=usage(24, 112, prompt_tokens_details={"cached_tokens": 0}),
        system_fingerprint="0.30.2",
    )


def ollama_chat() -> Json:
    return _chat("llama3.2", usage=usage(30, 60), system_fingerprint="fp_ollama")


ALL_BODIES: dict[str, list[Json]] = {
    "lmstudio": [lmstudio_v1(), lmstudio_v1({}), lmstudio_api_v0()],
    "llamacpp": [llamacpp_chat(), llamacpp_chat(False), llamacpp_completion()],
    "vllm": [vllm_chat(), vllm_chat(metrics=False)],
    "sglang": [sglang_openai(), sglang_generate(), sglang_generate_old()],
    "vllm_mlx": [vllm_mlx_chat(), vllm_mlx_chat(None)],
    "openai": [openai_predicted(), openai_predicted(0, 0), llamacpp_chat(), vllm_chat()],
    "speclane": [speclane_chat(), speclane_batching()],
    "mlx_lm": [mlx_lm_chat()],
    "ollama": [ollama_chat()],
}
