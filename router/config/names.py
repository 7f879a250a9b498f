"""Names that are contracts with the outside: the lanes and the HTTP headers.

Defined once here (the ground floor) so that configuration, routing, the proxy and the
tests all spell them the same way.
"""

from __future__ import annotations

from typing import Literal

LaneName = Literal["speculative", "batching"]
LANE_NAMES: tuple[LaneName, ...] = ("speculative", "batching")

# Request headers.
AUTHORIZATION = "Authorization"
CLIENT_HEADER = "X-Speclane-Client"  # also a response header: the policy identified
PRESET_HEADER = "X-Speclane-Preset"
LANE_HEADER = "X-Speclane-Lane"  # also a response header: the lane that served
API_KEY_HEADER = "x-api-key"  # Anthropic's key header (the OpenAI door reads Authorization)
# Response headers.
BACKEND_HEADER = "X-Speclane-Backend"
DECISION_HEADER = "X-Speclane-Decision"
OVERHEAD_HEADER = "X-Speclane-Overhead-Ms"
QUEUE_HEADER = "X-Speclane-Queue-Ms"
LOAD_HEADER = "X-Speclane-Load-Ms"  # only when the request waited for its model to load
ATTEMPTS_HEADER = "X-Speclane-Attempts"

# The prompt-normalisation rules (``router.proxy.normalise``): a policy's
# ``normalise_prompts`` lists those it applies, and each is the ``reason`` of
# ``speclane_prefix_breaks_total`` when it fires.
PromptRule = Literal["claude-code-billing-header", "qwen-code-date-reminder"]
PROMPT_RULES: tuple[PromptRule, ...] = ("claude-code-billing-header", "qwen-code-date-reminder")
