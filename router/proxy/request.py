"""Request parsing (SSE framing is ``router.kernel.sse``).

What is forwarded is the parsed object, re-encoded (``ParsedRequest.body``), never the raw
bytes: what speclane validated is exactly what the backend gets, at every depth. JSON
parsers disagree on duplicate keys (``"max_tokens": 1000000, "max_tokens": 10``: orjson
keeps the last, others the first), so forwarding the raw bytes would let a body pass the
caps with one value and reach the backend with the other. Detecting duplicates exactly
costs more than re-encoding with orjson, a fraction of parsing the same body
(examples/results/overhead.md), so every body is re-encoded.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import orjson

from router.kernel.errors import bad_request
from router.kernel.request_rules import (
    MAX_JSON_DEPTH,
    MAX_N,
    integer,
    logit_bias,
    logprobs,
    nesting_error,
    number,
    seed,
    too_deep,
    typed,
)
from router.kernel.system_messages import fold_json, needs_fold
from router.kernel.worker_contract import (
    DRAFT_SOURCE_FIELD,
    DRAFT_TOKENS_FIELD,
    REQUEST_DRAFT_SOURCES,
)
from router.routing.types import Endpoint, RouteRequest
from router.speculation.families import classify_family

MAX_TOKENS_LIMIT = 1_000_000


@dataclass(slots=True)
class ParsedRequest:
    endpoint: Endpoint
    raw: bytes  # as received; never forwarded (see the module docstring)
    data: dict[str, Any]
    route: RouteRequest
    changed: bool = False  # speclane changed a field (clamped, aliased...)
    # The token a lane of ours files the prompt's KV cache under (``router.proxy.partition``).
    cache_partition: str | None = None
    # Seconds the model stays loaded once idle after this request (Ollama's keep_alive;
    # None: its TTL), and the seconds this request waited for its model to load.
    keep_alive: float | None = None
    load_seconds: float = 0.0
    _encoded: bytes | None = None
    _folded: bytes | None = None

    def set_field(self, key: str, value: Any) -> None:
        self.data[key] = value
        # The two names of the token limit move together: a backend may read either.
        if (twin := TOKEN_TWINS.get(key)) is not None and twin in self.data:
            self.data[twin] = value
        self.changed = True
        self._encoded = self._folded = None

    def body(
        self, *, plain: bool = False, draft_source: str | None = None, fold_system: bool = False
    ) -> bytes:
        """The bytes to forward: ``data`` re-encoded (encoded once, reused by retries), so the
        upstream sees exactly what was validated. ``plain``: for the speculative lane decoding
        without its draft (a workload where speculation is off, or the baseline it is compared
        against), through the worker's ``num_draft_tokens`` request field. ``draft_source``:
        for the speculative lane drafting, the source the router chose for the request's
        family; never over the client's own ``draft_source``, which is forwarded as sent.
        ``fold_system``: for an external backend set to fold late system messages
        (``router.kernel.system_messages``); a chat request without any is forwarded as it is."""
        if self._encoded is None:
            self._encoded = orjson.dumps(self.data)
        if fold_system and self.endpoint == "chat" and needs_fold(self.data["messages"]):
            if self._folded is None:
                folded = fold_json(self.data["messages"])
                self._folded = orjson.dumps({**self.data, "messages": folded})
            return self._folded
        if plain:
            return self._with_field(DRAFT_TOKENS_FIELD, 0)
        if draft_source is not None and DRAFT_SOURCE_FIELD not in self.data:
            return self._with_field(DRAFT_SOURCE_FIELD, draft_source)
        return self._encoded

    def _with_field(self, key: str, value: Any) -> bytes:
        """The encoded body with one more top-level field. A key the client did not send is
        appended to the bytes already encoded (an agent's 50 KB body is not encoded a second
        time for one field); one it did send is replaced in a re-encoded copy, so no key is
        ever sent twice."""
        assert self._encoded is not None
        if key in self.data:
            return orjson.dumps({**self.data, key: value})
        # ``data`` is a non-empty object (it has ``model``): its encoding ends with "}".
        return b"".join(
            (self._encoded[:-1], b",", orjson.dumps(key), b":", orjson.dumps(value), b"}")
        )


def load_object(raw: bytes, *, depth_rule: bool = True) -> dict[str, Any]:
    """The request body as a JSON object, or a 400: every endpoint that takes a body decodes
    it here, under the one depth rule (``request_rules.MAX_JSON_DEPTH``), so that nothing
    after it (a translation, the re-encoding, an egress echoing a field) meets nesting it
    cannot write back. ``depth_rule=False``: a front door's translation of a body that
    passed the rule (it nests a few levels deeper, as it must)."""
    if not raw.strip():
        raise bad_request("request body is empty; expected a JSON object", code="invalid_json")
    try:
        data = orjson.loads(raw)
    except orjson.JSONDecodeError as e:
        raise bad_request(f"request body is not valid JSON: {e}", code="invalid_json") from e
    if not isinstance(data, dict):
        raise bad_request("request body must be a JSON object", code="invalid_json")
    # Fewer brackets than the limit (in strings too: an over-count) cannot nest deeper.
    if depth_rule and raw.count(b"[") + raw.count(b"{") > MAX_JSON_DEPTH and too_deep(data):
        raise nesting_error()
    return data


def parse_request(endpoint: Endpoint, raw: bytes, *, translated: bool = False) -> ParsedRequest:
    """``translated``: ``raw`` is a front door's translation of a client's body, which
    passed the depth rule as it was read."""
    data = load_object(raw, depth_rule=not translated)
    model = data.get("model")
    if not isinstance(model, str) or not model.strip():
        raise bad_request("'model' is required and must be a non-empty string", param="model")
    if len(model) > 512:
        raise bad_request("'model' is too long (512 characters at most)", param="model")
    _check_payload(endpoint, data)
    stream = typed(data, "stream", bool, False)
    n = integer(data, "n", 1, 1, MAX_N)
    max_tokens = _max_tokens(data)
    temperature = number(data, "temperature", None, 0, 2)
    route = RouteRequest(
        endpoint=endpoint,
        model=model,
        stream=stream,
        n=n,
        max_tokens=max_tokens,
        temperature=temperature,
        prompt_chars=_prompt_chars(endpoint, data),
        family=classify_family(data) if endpoint != "embeddings" else "chat",
        draft_source=_asked_source(data),
    )
    parsed = ParsedRequest(endpoint=endpoint, raw=raw, data=data, route=route)
    try:
        parsed.body()  # encoded now: what cannot be forwarded is the client's 400
    except orjson.JSONEncodeError as e:  # orjson writes 254 levels of nesting, reads 1024
        raise bad_request(f"request body cannot be forwarded: {e}", code="invalid_json") from e
    return parsed


def _asked_source(data: dict[str, Any]) -> str | None:
    """The client's own ``draft_source`` when it is one the lane accepts (any other value is
    forwarded too, and the lane answers the 400)."""
    value = data.get(DRAFT_SOURCE_FIELD)
    return value if isinstance(value, str) and value in REQUEST_DRAFT_SOURCES else None


def _check_payload(endpoint: Endpoint, data: dict[str, Any]) -> None:
    if endpoint == "chat":
        messages = data.get("messages")
        if not isinstance(messages, list) or not messages:
            raise bad_request(
                "'messages' is required and must be a non-empty array", param="messages"
            )
        for i, m in enumerate(messages):
            if not isinstance(m, dict) or not isinstance(m.get("role"), str):
                raise bad_request(
                    f"'messages[{i}]' must be an object with a string 'role'",
                    param=f"messages[{i}]",
                )
    elif endpoint == "completions":
        if not isinstance(data.get("prompt"), str | list):
            raise bad_request("'prompt' is required (a string or an array)", param="prompt")
    elif not isinstance(data.get("input"), str | list):
        raise bad_request("'input' is required (a string or an array)", param="input")
    typed(data, "stream_options", dict, None)
    if endpoint != "embeddings":
        # OpenAI's types and ranges, checked here as well as at the lane (which also knows
        # the vocabulary): a bad one is this client's 400 before it takes a queue slot.
        logprobs(data, chat=endpoint == "chat")
        logit_bias(data)
        seed(data)


TOKEN_TWINS = {"max_tokens": "max_completion_tokens", "max_completion_tokens": "max_tokens"}


def _max_tokens(data: dict[str, Any]) -> int | None:
    """The token limit. Both names are checked; when a request sets both, both become the
    smaller value, since backends differ in which one they read (mlx_lm and vLLM prefer
    ``max_completion_tokens``, others ``max_tokens``) and the caps apply to one value."""
    found = []
    for key in ("max_completion_tokens", "max_tokens"):
        value = integer(data, key, None, 1, MAX_TOKENS_LIMIT)
        if value is not None:
            found.append(value)
    if not found:
        return None
    limit = min(found)
    if len(found) == 2:
        data["max_completion_tokens"] = data["max_tokens"] = limit
    return limit


def _prompt_chars(endpoint: Endpoint, data: dict[str, Any]) -> int:
    if endpoint == "chat":
        total = 0
        for m in data["messages"]:
            content = m.get("content")
            if isinstance(content, str):
                total += len(content)
            elif isinstance(content, list):
                total += sum(
                    len(p.get("text", ""))
                    for p in content
                    if isinstance(p, dict) and isinstance(p.get("text"), str)
                )
        return total
    field = data.get("prompt" if endpoint == "completions" else "input")
    if isinstance(field, str):
        return len(field)
    return sum(len(x) for x in field if isinstance(x, str)) if isinstance(field, list) else 0
