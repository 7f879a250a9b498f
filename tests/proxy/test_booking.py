"""One request's bookkeeping (``router.proxy.booking``): whatever ends the request, it is
booked once, as the client gets it, in the metrics and the access log."""

from __future__ import annotations

import asyncio
import contextlib
from pathlib import Path

import pytest

from router.app import wire
from router.config.settings import load_settings
from router.kernel.errors import RouterError, bad_request
from router.proxy.booking import Booking
from router.proxy.outcome import Outcome
from router.proxy.services import Services


@pytest.fixture
def services(tmp_path: Path) -> Services:
    settings = load_settings(None, policies_dir=tmp_path, lanes={"enabled": False})
    return wire(settings).services


def booked(services: Services, error: BaseException | None, **kw: bool) -> Outcome:
    outcome = Outcome(endpoint="count_tokens", arrival=0.0, api="anthropic")
    expected = pytest.raises(type(error)) if error is not None else contextlib.nullcontext()
    with expected:
        with Booking(services, outcome, **kw) as book:
            book.client, book.model = "c", "asked"
            outcome.model = "served"
            if error is not None:
                raise error
    return outcome


def test_an_answer_is_booked_once_with_what_the_door_filled_in(services: Services) -> None:
    outcome = booked(services, None)
    (record,) = services.access.recent
    assert (record.client, record.model, record.status) == ("c", "asked", 0)
    assert outcome.finished_at is not None and outcome.error is None


def test_the_served_model_is_named_when_the_door_says_so(services: Services) -> None:
    booked(services, None, served_model=True)
    assert services.access.recent[-1].model == "served"


def test_an_error_is_booked_as_the_client_gets_it(services: Services) -> None:
    outcome = booked(services, bad_request("no"))
    assert outcome.status == 400 and isinstance(outcome.error, RouterError)
    outcome = booked(services, ValueError("a bug"))  # the middleware's 500 internal_error
    assert outcome.status == 500 and outcome.error is not None
    assert outcome.error.code == "internal_error"
    assert [r.status for r in services.access.recent] == [400, 500]


def test_a_client_that_left_is_a_disconnect(services: Services) -> None:
    outcome = booked(services, asyncio.CancelledError())
    assert outcome.client_gone
    assert services.access.recent[-1].status == 499


def test_a_door_with_more_to_do_ends_before_the_access_line(services: Services) -> None:
    seen: list[int] = []

    class Door(Booking):
        __slots__ = ()

        def ended(self) -> None:
            seen.append(len(self.services.access.recent))

    with Door(services, Outcome(endpoint="chat", arrival=0.0)):
        pass
    assert seen == [0] and len(services.access.recent) == 1
