"""The real client from X-Forwarded-For, trusted hops only (gateway.hub.admission.forwarded)."""

from __future__ import annotations

import pytest

from gateway.hub.admission.forwarded import (
    MAX_HOPS,
    client_address,
    forwarded_entry,
    parse_networks,
    source_ips,
    trusts,
)
from gateway.wire.http1 import RequestHead, parse_request_head

PROXIES = parse_networks(["10.0.0.0/8", "192.168.1.1"], "--forwarded-for-from")


def head(*xff: str) -> RequestHead:
    lines = "".join(f"X-Forwarded-For: {v}\r\n" for v in xff)
    return parse_request_head(f"GET /c1/api HTTP/1.1\r\nHost: h\r\n{lines}\r\n".encode())


@pytest.mark.parametrize(("peer", "xff", "client"), [
    ("10.0.0.1", ["203.0.113.1"], "203.0.113.1"),
    ("10.0.0.1", ["6.6.6.6, 203.0.113.1, 10.2.3.4"], "203.0.113.1"),
    ("10.0.0.1", ["6.6.6.6", "203.0.113.1", "10.2.3.4"], "203.0.113.1"),  # lines in order
    ("10.0.0.1", ["10.9.9.9, 10.2.3.4"], "10.9.9.9"),  # all trusted: the left-most
    ("10.0.0.1", ["203.0.113.1, garbage, 10.2.3.4"], "10.2.3.4"),
    ("10.0.0.1", ["203.0.113.1, "], "10.0.0.1"),  # an empty last entry: nothing accepted
    ("10.0.0.1", [], "10.0.0.1"),
    ("203.0.113.9", ["1.2.3.4"], "203.0.113.9"),  # an untrusted peer's header is ignored
    ("::ffff:10.0.0.1", ["203.0.113.1"], "203.0.113.1"),  # dual-stack view of a proxy
    ("192.168.1.1", ["::ffff:203.0.113.1"], "203.0.113.1"),
    ("10.0.0.1", ["2001:db8::1"], "2001:db8::1"),
])
def test_client_address(peer: str, xff: list[str], client: str) -> None:
    assert client_address(peer, head(*xff), PROXIES) == client


def test_without_trust_the_peer_is_the_client() -> None:
    assert client_address("10.0.0.1", head("1.2.3.4"), ()) == "10.0.0.1"


def test_the_walk_is_bounded() -> None:
    chain = ", ".join(["203.0.113.1"] + [f"10.0.0.{i}" for i in range(1, 100)])
    # Past MAX_HOPS trusted hops the walk stops at the last one it accepted.
    got = client_address("10.0.0.200", head(chain), PROXIES)
    assert got == f"10.0.0.{99 - MAX_HOPS + 1}"


@pytest.mark.parametrize(("entry", "address"), [
    ("203.0.113.1", "203.0.113.1"),
    (" 203.0.113.1 ", "203.0.113.1"),
    ("203.0.113.1:8080", "203.0.113.1"),
    ("[2001:db8::1]:443", "2001:db8::1"),
    ("[2001:db8::1]", "2001:db8::1"),
    ("2001:db8::1", "2001:db8::1"),
    ("unknown", None),
    ("_hidden", None),
    ("[2001:db8::1", None),
    ("203.0.113.01", None),
    ("", None),
])
def test_forwarded_entry(entry: str, address: str | None) -> None:
    assert forwarded_entry(entry) == address


def test_parse_networks() -> None:
    assert [str(n) for n in parse_networks(["10.0.0.0/8,127.0.0.1", " ::1 "], "--x")] == [
        "10.0.0.0/8", "127.0.0.1/32", "::1/128"]
    with pytest.raises(ValueError, match="--x 'nope'"):
        parse_networks(["nope"], "--x")
    assert trusts(PROXIES, "192.168.1.1") and not trusts(PROXIES, "192.168.1.2")
    assert not trusts(PROXIES, "unknown")


def test_source_ips_are_the_client_then_the_proxies() -> None:
    assert source_ips("203.0.113.1", "10.0.0.1", "10.0.0.1") == ("203.0.113.1", "10.0.0.1")
    assert source_ips("127.0.0.1", "127.0.0.1", "127.0.0.1") == ("127.0.0.1",)
    assert source_ips("unknown", "unknown", "unknown") == ()
