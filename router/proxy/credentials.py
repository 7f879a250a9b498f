"""The one API key a request presents, from its credential headers (every door)."""

from __future__ import annotations

from collections.abc import Sequence

from router.config.names import API_KEY_HEADER, AUTHORIZATION
from router.config.policies import bearer_token
from router.kernel.errors import RouterError


def presented_key(
    authorizations: Sequence[str], api_keys: Sequence[str] = (), *, use_api_key_header: bool = False
) -> str | None:
    """The one API key a request presents: its ``Authorization: Bearer`` token, else (where
    the API has one, ``use_api_key_header``) its ``x-api-key``.

    Credentials that disagree are a 400, never resolved silently: two different
    ``Authorization`` values, two different ``x-api-key`` values, or a bearer token and an
    ``x-api-key`` that differ (on every door: a gateway in front may read either header,
    and then it and speclane would disagree about who the caller is). The same value
    repeated is one credential.
    """
    authorization = _one(AUTHORIZATION, [a.strip() for a in authorizations])
    api_key = _one(API_KEY_HEADER, [k.strip() for k in api_keys])
    token = bearer_token(authorization)
    if token is not None and api_key and token != api_key:
        raise _conflict(f"the key in Authorization and the one in {API_KEY_HEADER} differ")
    if token is not None or not use_api_key_header:
        return token
    return api_key or None


def _one(header: str, values: list[str]) -> str | None:
    if len(set(values)) > 1:
        raise _conflict(f"{len(set(values))} different {header} headers")
    return values[0] if values else None


def _conflict(message: str) -> RouterError:
    return RouterError(
        400, f"conflicting credentials: {message}; send one", code="conflicting_credentials"
    )
