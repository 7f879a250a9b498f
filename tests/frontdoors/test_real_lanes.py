"""Both front doors in front of the real MLX lanes (slow, serial; few tokens).

Text round trips, streaming and not, with the official anthropic and ollama clients; a forced
tool call and its result through the Anthropic door; the
lanes' own tokenizer for count_tokens; the lanes' refusal of an image in Anthropic's shape.
"""

from __future__ import annotations

import anthropic
import ollama
import pytest

from router.lanes.modelprep import DEFAULT_MODEL_NAME
from tests.conftest import metric_value
from tests.realmodel import Router

pytestmark = pytest.mark.realmodel

QUESTION = [{"role": "user", "content": "What is the capital of France?"}]


@pytest.fixture
def router(real_lanes_router: Router) -> Router:
    return real_lanes_router


def root(router: Router) -> str:
    return router.base_url.removesuffix("/v1")


def claude(router: Router) -> anthropic.Anthropic:
    return anthropic.Anthropic(base_url=root(router), api_key="local", max_retries=0, timeout=120)


@pytest.mark.parametrize("lane", ["speculative", "batching"])
def test_anthropic_text_round_trip(router: Router, lane: str) -> None:
    answered = {"api": "anthropic", "backend": lane, "status": "200"}
    before = metric_value(router.metrics(), "speclane_requests_total", **answered) or 0
    with claude(router) as client:
        raw = client.messages.with_raw_response.create(
            model=DEFAULT_MODEL_NAME,
            max_tokens=12,
            messages=QUESTION,  # type: ignore[arg-type]
            extra_body={"temperature": 0},
            extra_headers={"X-Speclane-Lane": lane},
        )
        message = raw.parse()
        with client.messages.stream(
            model=DEFAULT_MODEL_NAME,
            max_tokens=12,
            messages=QUESTION,  # type: ignore[arg-type]
            extra_body={"temperature": 0},
            extra_headers={"X-Speclane-Lane": lane},
        ) as stream:
            streamed = stream.get_final_message()
        counted = client.messages.count_tokens(model=DEFAULT_MODEL_NAME, messages=QUESTION)  # type: ignore[arg-type]
    assert raw.headers["x-speclane-lane"] == lane
    assert "Paris" in message.content[0].text  # type: ignore[union-attr]
    assert streamed.content[0].text == message.content[0].text  # type: ignore[union-attr]
    assert message.stop_reason in ("end_turn", "max_tokens")
    assert message.usage.output_tokens > 0
    # count_tokens uses the lane's tokenizer and chat template: the same prompt, the same count
    # (Anthropic's input_tokens leave out the tokens read from the prompt cache).
    for answer in (message, streamed):
        usage = answer.usage
        assert counted.input_tokens == usage.input_tokens + (usage.cache_read_input_tokens or 0)
    metrics = router.metrics()
    assert metric_value(metrics, "speclane_requests_total", **answered) == before + 2
    if lane == "speculative":  # the speculative telemetry reads the (OpenAI) answers as usual
        drafted = metric_value(metrics, "speclane_spec_draft_tokens_total", backend=lane)
        assert drafted is not None and drafted > 0


@pytest.mark.parametrize("stream", [False, True], ids=["json", "stream"])
def test_anthropic_stop_sequence_is_reported(router: Router, stream: bool) -> None:
    """The worker says which stop string ended the answer (vLLM's ``stop_reason``)."""
    kwargs = {
        "model": DEFAULT_MODEL_NAME,
        "max_tokens": 12,
        "messages": QUESTION,
        "stop_sequences": ["Paris"],
        "extra_body": {"temperature": 0},
    }
    with claude(router) as client:
        if stream:
            with client.messages.stream(**kwargs) as s:  # type: ignore[arg-type]
                message = s.get_final_message()
        else:
            message = client.messages.create(**kwargs)  # type: ignore[arg-type]
    assert (message.stop_reason, message.stop_sequence) == ("stop_sequence", "Paris")
    assert "Paris" not in message.content[0].text  # type: ignore[union-attr]


def test_anthropic_image_is_refused_by_the_lanes(router: Router) -> None:
    image = {
        "type": "image",
        "source": {"type": "base64", "media_type": "image/png", "data": "iVBORw0KGgo="},
    }
    with claude(router) as client, pytest.raises(anthropic.BadRequestError) as refused:
        client.messages.create(
            model=DEFAULT_MODEL_NAME,
            max_tokens=4,
            messages=[
                {"role": "user", "content": [image, {"type": "text", "text": "What is it?"}]}
            ],
        )
    assert refused.value.body["error"]["type"] == "invalid_request_error"  # type: ignore[index]
    assert "text" in refused.value.message


def test_ollama_text_round_trip(router: Router) -> None:
    client = ollama.Client(host=root(router), timeout=120, headers={"X-Speclane-Lane": "batching"})
    options = {"temperature": 0, "num_predict": 12}
    whole = client.chat(model=DEFAULT_MODEL_NAME, messages=QUESTION, stream=False, options=options)
    parts = list(
        client.chat(model=DEFAULT_MODEL_NAME, messages=QUESTION, stream=True, options=options)
    )
    generated = client.generate(
        model=DEFAULT_MODEL_NAME, prompt=QUESTION[0]["content"], stream=False, options=options
    )
    assert "Paris" in (whole.message.content or "")
    assert "".join(p.message.content or "" for p in parts) == whole.message.content
    assert generated.response == whole.message.content
    last = parts[-1]
    assert last.done and last.eval_count == whole.eval_count > 0
    assert last.prompt_eval_count == whole.prompt_eval_count > 0
    assert [m.model for m in client.list().models] == [DEFAULT_MODEL_NAME]


def test_count_tokens_for_a_model_the_lanes_do_not_serve_is_a_404(router: Router) -> None:
    with claude(router) as client, pytest.raises(anthropic.NotFoundError):
        client.messages.count_tokens(model="no-such-model", messages=QUESTION)  # type: ignore[arg-type]


WEATHER = {
    "name": "get_weather",
    "description": "The current weather in a city",
    "input_schema": {
        "type": "object",
        "properties": {"city": {"type": "string"}},
        "required": ["city"],
    },
}


@pytest.mark.parametrize("stream", [False, True], ids=["json", "stream"])
def test_anthropic_tool_round_trip_on_the_lanes(router: Router, stream: bool) -> None:
    """A forced tool call from the lane (constrained decoding through the fallback template),
    its result sent back as a tool_result block, and the model's answer after it."""
    ask = [{"role": "user", "content": "What is the weather in Paris?"}]
    kwargs = {
        "model": DEFAULT_MODEL_NAME,
        "max_tokens": 40,
        "tools": [WEATHER],
        "tool_choice": {"type": "tool", "name": "get_weather"},
        "extra_body": {"temperature": 0},
    }
    with claude(router) as client:
        if stream:
            with client.messages.stream(messages=ask, **kwargs) as s:  # type: ignore[arg-type]
                called = s.get_final_message()
        else:
            called = client.messages.create(messages=ask, **kwargs)  # type: ignore[arg-type]
        uses = [b for b in called.content if b.type == "tool_use"]
        assert called.stop_reason == "tool_use", called
        assert len(uses) == 1 and uses[0].name == "get_weather"
        assert isinstance(uses[0].input, dict) and isinstance(uses[0].input.get("city"), str)
        answer = client.messages.create(
            model=DEFAULT_MODEL_NAME,
            max_tokens=12,
            tools=[WEATHER],  # type: ignore[list-item]
            extra_body={"temperature": 0},
            messages=[
                *ask,  # type: ignore[list-item]
                {"role": "assistant", "content": called.content},
                {
                    "role": "user",
                    "content": [
                        {
                            "type": "tool_result",
                            "tool_use_id": uses[0].id,
                            "content": "Sunny, 21 degrees",
                        }
                    ],
                },
            ],
        )
    assert answer.stop_reason in ("end_turn", "max_tokens", "tool_use")
    assert prompt_tokens(answer) > prompt_tokens(called)  # the result reached the lane


def prompt_tokens(message: anthropic.types.Message) -> int:
    """The whole prompt: Anthropic's input_tokens leave the cached tokens out."""
    return message.usage.input_tokens + (message.usage.cache_read_input_tokens or 0)


WEATHER = {
    "name": "get_weather",
    "description": "The weather in a city",
    "input_schema": {
        "type": "object",
        "properties": {"city": {"type": "string"}},
        "required": ["city"],
    },
}


def test_count_tokens_counts_tools_and_system_messages_as_the_lane_renders_them(
    router: Router,
) -> None:
    """What Claude Code sends: a system field, a system message after the user's turn, tools."""
    messages = [
        {"role": "user", "content": "What is the weather in Paris?"},
        {"role": "system", "content": "The user is in France."},
    ]
    asked = {"model": DEFAULT_MODEL_NAME, "system": "You are terse.", "messages": messages}
    with claude(router) as client:
        bare = client.messages.count_tokens(**asked)  # type: ignore[arg-type]
        with_tools = client.messages.count_tokens(**asked, tools=[WEATHER])  # type: ignore
        answer = client.messages.create(
            **asked,
            tools=[WEATHER],
            max_tokens=4,  # type: ignore
            extra_body={"temperature": 0},
        )
    assert with_tools.input_tokens > bare.input_tokens
    usage = answer.usage
    assert with_tools.input_tokens == usage.input_tokens + (usage.cache_read_input_tokens or 0)
