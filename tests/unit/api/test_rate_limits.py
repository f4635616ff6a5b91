"""Who a request is counted as: the socket peer, X-Forwarded-For only from a trusted proxy
(read from the right), IPv6 per /64."""

from __future__ import annotations

import ipaddress

import pytest

from aivedio.api.rate_limits import client_address

PROXIES = (ipaddress.ip_network("10.0.0.0/8"), ipaddress.ip_network("fd00::/8"))


@pytest.mark.parametrize(
    ("peer", "forwarded_for", "client"),
    [
        # An untrusted peer is the client, whatever it writes.
        ("203.0.113.9", [], "203.0.113.9"),
        ("203.0.113.9", ["198.51.100.1"], "203.0.113.9"),
        # A trusted proxy: the rightmost address that is not a trusted proxy.
        ("10.0.0.2", ["198.51.100.1"], "198.51.100.1"),
        ("10.0.0.2", ["6.6.6.6, 198.51.100.1, 10.1.1.1"], "198.51.100.1"),
        ("10.0.0.2", ["6.6.6.6", "198.51.100.1"], "198.51.100.1"),  # two header lines
        ("10.0.0.2", [" 198.51.100.1 "], "198.51.100.1"),
        # Garbage ends the walk at the proxy that passed it on.
        ("10.0.0.2", ["198.51.100.1, not-an-ip"], "10.0.0.2"),
        ("10.0.0.2", ["198.51.100.1, not-an-ip, 10.3.3.3"], "10.3.3.3"),
        ("10.0.0.2", ["198.51.100.1:4711"], "10.0.0.2"),
        ("10.0.0.2", [], "10.0.0.2"),
        ("10.0.0.2", ["10.9.9.9"], "10.9.9.9"),  # proxies all the way: the last one seen
        # IPv6 per /64; an IPv4 client seen through a dual-stack socket is itself.
        ("2001:db8:1:2:aaaa::1", [], "2001:db8:1:2::/64"),
        ("2001:db8:1:2:bbbb::7", [], "2001:db8:1:2::/64"),
        ("fd00::1", ["2001:db8:9:9::5"], "2001:db8:9:9::/64"),
        ("::ffff:203.0.113.9", [], "203.0.113.9"),
        # Not an address at all (a Unix socket): its name, or one bucket for all of them.
        (None, ["198.51.100.1"], "unknown"),
        ("", [], "unknown"),
    ],
)
def test_the_client_address(peer: str | None, forwarded_for: list[str], client: str) -> None:
    assert client_address(peer, forwarded_for, PROXIES) == client


def test_without_trusted_proxies_forwarded_for_is_never_read() -> None:
    assert client_address("10.0.0.2", ["198.51.100.1"], ()) == "10.0.0.2"
