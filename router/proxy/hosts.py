"""Which ``Host`` (and ``Origin``) names a request may carry: the DNS-rebinding rule.

A web page can make a browser send requests to speclane only under a name the page's own
origin uses; DNS rebinding points such a name (``rebind.attacker.example``) at 127.0.0.1,
so the browser connects to speclane but still sends ``Host: rebind.attacker.example``. A
request is therefore answered only when its Host names speclane as the machine knows it:

- a loopback name: ``localhost`` and its subdomains (browsers resolve ``*.localhost`` to
  loopback themselves, RFC 6761), any 127.x.y.z, ``[::1]``;
- an ``allowed_hosts`` entry: a name, ``.domain`` (it and every subdomain), or ``*``
  (anything: the rule is off);
- the address speclane is bound to when that is not loopback (``--host mybox.lan`` allows
  ``mybox.lan``); a wildcard bind (``0.0.0.0``, ``::``) allows every IP address (an address
  cannot be rebound: a browser sends it only when it connected to it) and this machine's
  host name (with and without ``.local``).

A request without a Host header is allowed: every browser sends one. Ports are ignored.
Pure: no I/O apart from reading the machine's host name once, when the rule is built.
"""

from __future__ import annotations

import functools
import ipaddress
import re
import socket
from collections.abc import Iterable
from dataclasses import dataclass
from urllib.parse import urlsplit

from router.kernel.request_rules import parse_ascii_int

WILDCARD_BINDS = ("", "0.0.0.0", "::")
_NAME = re.compile(r"[a-z0-9_-][a-z0-9_.-]*")


def host_name(value: str) -> str | None:
    """The host of a ``Host`` header value (``name[:port]``, ``[v6][:port]``), normalised as
    ``allowed_hosts`` entries are; None when it is not a well-formed host."""
    value = value.strip().lower()
    if value.startswith("["):
        inside, bracket, rest = value[1:].partition("]")
        if not bracket or (rest and not _is_port(rest[1:] if rest[0] == ":" else "x")):
            return None
        try:
            address = ipaddress.IPv6Address(inside.split("%", 1)[0])
        except ValueError:
            return None
        return f"[{address.compressed}]"
    name, colon, port = value.partition(":")
    if colon and not _is_port(port):
        return None
    name = name.rstrip(".")
    try:
        return ipaddress.IPv4Address(name).compressed
    except ValueError:
        pass
    return name if _NAME.fullmatch(name) else None


def origin_host(origin: str) -> str | None:
    """The host of an ``Origin`` header (``scheme://host[:port]``); None for ``null`` and
    anything that is not such an origin."""
    try:
        parts = urlsplit(origin.strip())
        netloc = parts.netloc
    except ValueError:
        return None
    if parts.scheme not in ("http", "https") or not netloc or "@" in netloc:
        return None
    return host_name(netloc)


def same_origin(origin: str, host_header: str) -> bool:
    """Whether an ``Origin`` names the very host and port the request was sent to."""
    try:
        netloc = urlsplit(origin.strip()).netloc
    except ValueError:
        return False
    return bool(netloc) and netloc.lower() == host_header.strip().lower()


def is_loopback_name(host: str) -> bool:
    if host == "localhost" or host.endswith(".localhost"):
        return True
    try:
        address = ipaddress.ip_address(host.removeprefix("[").removesuffix("]"))
    except ValueError:
        return False
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        return address.ipv4_mapped.is_loopback
    return address.is_loopback


def is_address(host: str) -> bool:
    try:
        ipaddress.ip_address(host.removeprefix("[").removesuffix("]"))
    except ValueError:
        return False
    return True


@dataclass(frozen=True, slots=True)
class HostRule:
    names: frozenset[str]  # exact names and addresses (normalised)
    domains: tuple[str, ...] = ()  # ".example.com": it and its subdomains
    any_address: bool = False  # a wildcard bind: every IP address
    anything: bool = False  # allowed_hosts = ["*"]

    @classmethod
    def build(
        cls, allowed: Iterable[str], bind_host: str, machine_name: str | None = None
    ) -> HostRule:
        """``allowed``: ``allowed_hosts`` entries, already validated and normalised."""
        entries = list(allowed)
        names = {e for e in entries if e != "*" and not e.startswith(".")}
        domains = tuple(e for e in entries if e.startswith("."))
        wildcard = bind_host.strip() in WILDCARD_BINDS
        if wildcard:
            machine = machine_name if machine_name is not None else socket.gethostname()
            machine = machine.lower().rstrip(".")
            if machine:
                names.update({machine, f"{machine}.local"})
        elif (bound := host_name(_bracketed(bind_host))) is not None:
            names.add(bound)
        return cls(frozenset(names), domains, any_address=wildcard, anything="*" in entries)

    def allows(self, host: str | None) -> bool:
        """Whether a request naming ``host`` (a normalised name, see ``host_name``) is
        answered; None (not a well-formed host) never is."""
        if host is None:
            return False
        if self.anything or host in self.names or is_loopback_name(host):
            return True
        if self.any_address and is_address(host):
            return True
        return any(host == d[1:] or host.endswith(d) for d in self.domains)

    def allows_header(self, value: str) -> bool:
        return _allows_header(self, value)


@functools.lru_cache(maxsize=256)
def _allows_header(rule: HostRule, value: str) -> bool:
    # Every request asks about the same few Host values: judge each once (bounded).
    return rule.allows(host_name(value))


def _is_port(text: str) -> bool:
    return parse_ascii_int(text, 0, 65535) is not None


def _bracketed(host: str) -> str:
    """A bind address as it would appear in a Host header (IPv6 in brackets)."""
    return f"[{host}]" if ":" in host and not host.startswith("[") else host
