"""Talk to speclane with the official OpenAI Python SDK.

    pip install openai
    python examples/openai_sdk.py            # against http://127.0.0.1:8080/v1

Identify the client with a policy header (or an API key from a policy), choose a preset,
and read back what the router decided from the response headers.
"""

from __future__ import annotations

import os

from openai import OpenAI

client = OpenAI(
    base_url=os.environ.get("SPECLANE_URL", "http://127.0.0.1:8080/v1"),
    api_key=os.environ.get("SPECLANE_API_KEY", "local"),  # any string unless a policy needs a key
    default_headers={"X-Speclane-Client": "opta-cli"},  # or let the key / user agent identify you
)
MODEL = os.environ.get("SPECLANE_MODEL", "SmolLM2-135M-Instruct")

# An interactive request: streamed, routed by the client's policy (speculative lane if free).
raw = client.chat.completions.with_raw_response.create(
    model=MODEL,
    messages=[{"role": "user", "content": "Write a haiku about routers."}],
    stream=True,
    stream_options={"include_usage": True},
    extra_headers={"X-Speclane-Preset": "interactive"},
)
print("lane:", raw.headers["x-speclane-lane"], "| decision:", raw.headers["x-speclane-decision"])
for chunk in raw.parse():
    if chunk.choices:
        print(chunk.choices[0].delta.content or "", end="", flush=True)
    if chunk.usage:
        spec = (chunk.usage.model_extra or {}).get("speclane_spec")
        print("\nusage:", chunk.usage.completion_tokens, "tokens; speculation:", spec)

# A throughput request via the model suffix: the batching lane.
done = client.chat.completions.create(
    model=f"{MODEL}@throughput",
    messages=[{"role": "user", "content": "List three prime numbers."}],
    max_tokens=32,
)
print(done.choices[0].message.content)
