"""One table per backend kind: every consumer reads its column, and every kind has them."""

from __future__ import annotations

from typing import get_args

import pytest

from router.backends import scrape
from router.backends.base import SPECLANE_KIND
from router.config.kinds import CONFIGURABLE, KINDS, SPECLANE
from router.config.settings import BackendKind, BackendSpec
from router.speculation import parsers
from router.speculation.observed import observable


def test_the_configurable_kinds_are_the_tables_but_speclanes_own() -> None:
    assert get_args(BackendKind) == CONFIGURABLE
    assert SPECLANE_KIND == SPECLANE and SPECLANE not in CONFIGURABLE
    assert all(name == facts.name for name, facts in KINDS.items())


def test_every_kind_has_a_parser_and_the_silent_ones_report_nothing() -> None:
    assert set(parsers.PARSERS) == set(KINDS)
    for name, facts in KINDS.items():
        assert observable(name) is not facts.silent
        assert facts.silent or facts.stat_fields, f"{name}: a parser that reads no field"
        result = parsers.parse_response(name, {"usage": {"completion_tokens": 3}})
        if facts.silent:
            assert result == parsers.NotReported(name, "not_supported")


def test_the_scraped_kinds_come_from_the_table() -> None:
    assert (
        {k for k, f in KINDS.items() if f.scrape}
        == set(scrape.SOURCES)
        == {
            "vllm",
            "llamacpp",
            "vllm_mlx",
        }
    )
    assert scrape.SOURCES["vllm_mlx"][0] == "/v1/status"


@pytest.mark.parametrize("kind", CONFIGURABLE)
def test_a_backends_system_messages_default_is_its_kinds(kind: str) -> None:
    spec = BackendSpec(name="b", kind=kind, base_url="http://127.0.0.1:1/v1")  # type: ignore[arg-type]
    assert spec.system_messages == KINDS[kind].system_messages
    assert (
        BackendSpec(
            name="b",
            kind=kind,
            base_url="http://127.0.0.1:1/v1",
            system_messages="as_is",  # type: ignore[arg-type]
        ).system_messages
        == "as_is"
    )
