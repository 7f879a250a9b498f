"""Who a request is: the frozen ``PolicySet`` of the loaded policies and its lookups
(``PolicySet.identify``), in this order of precedence:

1. an API key (``Authorization: Bearer ...``) listed by a policy: the key is proof;
2. the ``X-Speclane-Client`` header, compared case-insensitively;
3. the ``User-Agent``, against each policy's regular expressions (``re.search``), policies
   taken in file-name order, first match wins;
4. the ``default`` policy (``policies/default.toml``; when there is none, an implied
   permissive default: no key required, overrides allowed, no concurrency limit).

The key rule (``PolicySet.admits_without_key``, also what ``serve``'s exposure warning
asks): a header or user agent never opens what the default keeps closed. Without a valid
key a request is served only when the default serves requests without a key, and never
under a policy that requires one. (On an open router a label still selects a key-less
policy, with its lanes, presets and priority: that is what labels are for.)

- ``require_api_key = true`` on the default closes the router: every request needs some
  valid key (any policy's); the header and user agent are then ignored, so naming a
  key-less policy or sending its user agent opens nothing.
- ``require_api_key = true`` on another policy: that policy is used only with one of its
  keys. A header or user agent that points at it without the key is treated like an
  unknown name (the request falls back to the default), so a probe cannot tell a name that
  exists and needs a key from a name that does not exist: both are answered alike.
- An unknown key on an open router is ignored (OpenAI SDKs always send some key) and
  recognition goes on with steps 2-4; on a closed one it is a 401 (``invalid_api_key``). A
  ``Bearer`` value that is not valid UTF-8 can be no key: always 401.

Prompt-cache partitions (``PolicySet.cache_partition``): a lane reuses the KV state of an
earlier prompt only for a request of the same partition, so that ``cached_tokens`` and the
time to the first token never tell one client what another has sent. A request identified
by one of a policy's keys is in that policy's partition, or in the ``cache_group`` it names
(policies naming the same group share their cache entries); every other request (identified
by ``X-Speclane-Client``, User-Agent, or nothing: labels prove nothing) is in the default
policy's partition.

API keys are given inline (``api_keys``) or by environment variable name (``api_key_env``,
preferred). They are kept as SHA-256 digests for lookup and shown only as ``key#<8 hex>``
or ``$NAME``; no message or table prints a key.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field

from router.config.policies.schema import DEFAULT_CLIENT, Policy, Via


@dataclass(frozen=True, slots=True)
class Identity:
    policy: Policy
    via: Via
    key_presented: bool  # the request carried an API key, known or not
    malformed_key: bool = False  # the key is not valid UTF-8: it can be nobody's key


def key_digest(key: str) -> str:
    return hashlib.sha256(key.encode("utf-8")).hexdigest()


def _digest_or_none(key: str) -> str | None:
    """None for a header value that is no text (aiohttp keeps undecodable bytes as lone
    surrogates, which no configured key can contain)."""
    try:
        return key_digest(key)
    except UnicodeEncodeError:
        return None


def mask_key(key: str) -> str:
    return "key#" + key_digest(key)[:8]


def bearer_token(authorization: str | None) -> str | None:
    """The token of an ``Authorization: Bearer <token>`` header, else None."""
    if not authorization:
        return None
    scheme, _, token = authorization.strip().partition(" ")
    token = token.strip()
    return token if scheme.lower() == "bearer" and token else None


@dataclass(frozen=True)
class PolicySet:
    """The validated policies of one directory, with the lookup tables built once."""

    policies: tuple[Policy, ...]  # file-name order; the default is among them
    default: Policy
    sources: Mapping[str, str] = field(default_factory=dict)  # client -> file ("(implied)")
    key_labels: Mapping[str, tuple[str, ...]] = field(default_factory=dict)  # client -> masked
    warnings: tuple[str, ...] = ()  # contradictions in the files: worth a warning
    # Facts of this machine, not mistakes in the files: a key variable unset, so the policy
    # cannot be selected by that key (the shipped batch.toml until SPECLANE_BATCH_API_KEY is
    # set). Said once at start-up, not as a warning.
    notes: tuple[str, ...] = ()
    _by_key: Mapping[str, str] = field(default_factory=dict, repr=False)  # digest -> client
    _by_header: Mapping[str, str] = field(default_factory=dict, repr=False)
    _by_agent: tuple[tuple[re.Pattern[str], str], ...] = field(default=(), repr=False)

    @classmethod
    def implied(cls) -> PolicySet:
        """Only the implied default: what serving without a policies directory means."""
        default = Policy(client=DEFAULT_CLIENT)
        return cls((default,), default, {DEFAULT_CLIENT: "(implied)"})

    def __iter__(self) -> Iterator[Policy]:
        return iter(self.policies)

    def __len__(self) -> int:
        return len(self.policies)

    def get(self, client: str) -> Policy | None:
        return next((p for p in self.policies if p.client == client), None)

    def admits_without_key(self, policy: Policy) -> bool:
        """The key rule: may a request without a valid key be served under ``policy``?

        Never when the default requires a key (every request needs one), nor when the
        policy itself does. Identification and the start-up exposure warning both ask this.
        """
        return not (self.default.require_api_key or policy.require_api_key)

    def keyless(self) -> tuple[Policy, ...]:
        """The policies a request without a valid key can get (empty: the router is closed)."""
        return tuple(p for p in self.policies if self.admits_without_key(p))

    def match(
        self, api_key: str | None, client_header: str | None, user_agent: str | None
    ) -> Identity:
        """Who the request is, by the precedence and key rule in the module docstring;
        never raises (``identify`` applies the verdict)."""
        presented = bool(api_key)
        if api_key:
            digest = _digest_or_none(api_key)
            if digest is None:
                return Identity(self.default, "default", True, malformed_key=True)
            if name := self._by_key.get(digest):
                return Identity(self._policy(name), "api_key", True)
        if self.default.require_api_key:
            return Identity(self.default, "default", presented)  # labels open nothing
        if client_header and (name := self._by_header.get(client_header.strip().lower())):
            policy = self._policy(name)
            if self.admits_without_key(policy):
                return Identity(policy, "client_header", presented)
        if user_agent:
            for pattern, name in self._by_agent:
                if pattern.search(user_agent) and self.admits_without_key(
                    policy := self._policy(name)
                ):
                    return Identity(policy, "user_agent", presented)
        return Identity(self.default, "default", presented)

    def cache_partition(self, identity: Identity) -> str:
        """The request's prompt-cache partition: its policy's when a key proved who it is,
        else the default policy's (see the module docstring)."""
        policy = identity.policy if identity.via == "api_key" else self.default
        return policy.cache_partition

    def identify(
        self, api_key: str | None, client_header: str | None, user_agent: str | None
    ) -> Policy:
        """The request's policy, or ``Unauthorized`` when the key rule refuses it."""
        identity = self.match(api_key, client_header, user_agent)
        self.authorize(identity)
        return identity.policy

    def authorize(self, identity: Identity) -> None:
        if identity.malformed_key:
            raise _unauthorized(
                identity.policy, "the API key is not valid UTF-8", "invalid_api_key"
            )
        if identity.via == "api_key" or self.admits_without_key(identity.policy):
            return
        if identity.key_presented:
            raise _unauthorized(identity.policy, "invalid API key", "invalid_api_key")
        raise _unauthorized(
            identity.policy,
            "this router requires an API key (Authorization: Bearer <key>)",
            "missing_api_key",
        )

    def _policy(self, name: str) -> Policy:
        policy = self.get(name)
        assert policy is not None, name  # the tables are built from self.policies
        return policy


class Unauthorized(Exception):
    """The key rule refused a request; the proxy answers it with a 401 (configuration
    knows no HTTP)."""

    def __init__(self, message: str, code: str, client: str) -> None:
        super().__init__(message)
        self.message = message
        self.code = code
        self.client = client  # the policy answered under: the default, for every label


def _unauthorized(policy: Policy, message: str, code: str) -> Unauthorized:
    return Unauthorized(message, code, policy.client)
