"""router.proxy.doorerrors: each door's error shape over the kernel's error core."""

from __future__ import annotations

import pytest

from router.kernel import errors
from router.proxy.doorerrors import Api, render, stream_error, unauthorized


def test_a_refused_key_is_a_401_that_names_only_the_policy_answered_under() -> None:
    status, _, headers = render(unauthorized("invalid API key", "invalid_api_key", "default"))
    assert status == 401
    assert headers["WWW-Authenticate"] == "Bearer" and headers["X-Speclane-Client"] == "default"


@pytest.mark.parametrize("api", ["openai", "responses"])
def test_the_openai_shaped_doors_answer_what_the_lane_worker_answers(api: Api) -> None:
    """The worker renders with the kernel alone; the router's OpenAI doors say the same."""
    err = errors.bad_request("no", param="model", code="why")
    assert render(err, api) == errors.render(err)
    assert stream_error(err, api) == errors.sse_error_event(err)
