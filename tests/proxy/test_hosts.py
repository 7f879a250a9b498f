"""The DNS-rebinding rule on its own: which Host and Origin names speclane answers."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from router.config.settings import ConfigError, load_settings
from router.proxy.hosts import HostRule, host_name, origin_host

LOOPBACK = HostRule.build((), "127.0.0.1")


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ("localhost", "localhost"),
        ("LocalHost:8080", "localhost"),
        ("localhost.:80", "localhost"),
        ("127.0.0.1:8080", "127.0.0.1"),
        ("[::1]:8080", "[::1]"),
        ("[0:0::1]", "[::1]"),
        ("example.com", "example.com"),
        ("xn--bcher-kva.example", "xn--bcher-kva.example"),
        ("", None),
        ("a b", None),
        ("[::1", None),
        ("[::1]x", None),
        ("::1", None),
        ("host:port", None),
        ("host:", None),
        ("bücher.example", None),
        ("[nothex]:80", None),
        ("example.com:123456", None),
    ],
)
def test_host_name_parses_what_a_host_header_holds(value: str, expected: str | None) -> None:
    assert host_name(value) == expected


@pytest.mark.parametrize(
    "host",
    [
        "localhost",
        "localhost:8080",
        "app.localhost:1",
        "127.0.0.1",
        "127.8.9.10:80",
        "[::1]:8080",
        "[::ffff:127.0.0.1]",
    ],
)
def test_loopback_names_are_always_allowed(host: str) -> None:
    assert LOOPBACK.allows_header(host)


@pytest.mark.parametrize(
    "host",
    [
        "rebind.attacker.example",
        "rebind.attacker.example:8080",
        "localhost.attacker.example",
        "127.0.0.1.nip.io",
        "192.168.1.5:8080",
        "[fe80::1]",
        "",
        "a b",
        "0x7f000001",
    ],
)
def test_anything_else_is_refused_on_a_loopback_bind(host: str) -> None:
    assert not LOOPBACK.allows_header(host)


def test_allowed_hosts_entries_names_domains_and_star() -> None:
    rule = HostRule.build(("mybox.lan", ".corp.example", "10.1.2.3", "[fe80::1]"), "127.0.0.1")
    for host in (
        "mybox.lan:8080",
        "corp.example",
        "a.b.corp.example",
        "10.1.2.3:1",
        "[fe80::1]:8080",
    ):
        assert rule.allows_header(host), host
    for host in ("other.lan", "evilcorp.example", "corp.example.evil", "10.1.2.4"):
        assert not rule.allows_header(host), host
    anything = HostRule.build(("*",), "127.0.0.1")
    assert anything.allows_header("rebind.attacker.example")
    assert not anything.allows_header("a b")  # not a host at all


def test_a_named_bind_allows_its_name() -> None:
    assert HostRule.build((), "mybox.lan").allows_header("mybox.lan:8080")
    assert HostRule.build((), "192.168.1.5").allows_header("192.168.1.5:8080")
    assert not HostRule.build((), "192.168.1.5").allows_header("192.168.1.6")
    assert HostRule.build((), "fe80::1").allows_header("[fe80::1]:8080")


@pytest.mark.parametrize("bind", ["0.0.0.0", "::", ""])
def test_a_wildcard_bind_allows_addresses_and_the_machine_name(bind: str) -> None:
    rule = HostRule.build((), bind, machine_name="MyBox")
    for host in ("192.168.1.5:8080", "[fe80::1]:8080", "10.0.0.1", "mybox:8080", "mybox.local"):
        assert rule.allows_header(host), host
    assert not rule.allows_header("rebind.attacker.example")


@pytest.mark.parametrize(
    ("origin", "expected"),
    [
        ("http://localhost:8080", "localhost"),
        ("https://app.example.com", "app.example.com"),
        ("http://[::1]:80", "[::1]"),
        ("null", None),
        ("file://", None),
        ("", None),
        ("http://user@localhost", None),
        ("javascript:alert(1)", None),
        ("http://[::1", None),
    ],
)
def test_origin_host(origin: str, expected: str | None) -> None:
    assert origin_host(origin) == expected


@given(st.text(max_size=60))
def test_host_parsing_never_raises(value: str) -> None:
    host = host_name(value)
    LOOPBACK.allows(host)
    origin_host(value)


def test_the_setting_normalises_and_refuses_what_is_not_a_host() -> None:
    settings = load_settings(None, allowed_hosts=["MyBox.Lan.", ".Example.com", "::1", "*"])
    assert settings.allowed_hosts == ("mybox.lan", ".example.com", "[::1]", "*")
    for bad in ("http://mybox.lan", "mybox.lan:8080", "a b", "", "my/box"):
        with pytest.raises(ConfigError, match="allowed_hosts"):
            load_settings(None, allowed_hosts=[bad])


def test_the_setting_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SPECLANE_ALLOWED_HOSTS", '["mybox.lan"]')
    assert load_settings(None).allowed_hosts == ("mybox.lan",)
