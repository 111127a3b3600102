"""Who the client really is when the gateway sits behind a load balancer or an ingress.

Behind a balancer every connection comes from the balancer's address, so everything keyed by
the client's address -- the failed-authentication limit (``hubload.FailedAuthLimiter``), the
audit line, the ``X-Forwarded-For`` sent towards the agent -- would see one client. Two opt-in
ways to see the real one, each trusting only what the operator names:

* the PROXY protocol, read before TLS by :mod:`gateway.hub.proxyaccept` from the addresses in
  ``--proxy-protocol-from`` (the connection's client address is then the header's);
* ``X-Forwarded-For`` from a proxy that terminates TLS (an ingress), trusted only on
  connections from ``--forwarded-for-from``: :func:`client_address` here.

The rule for ``X-Forwarded-For`` (nginx's ``real_ip_recursive``, Envoy's trusted hops): each
proxy appends the address it saw, so only the right-hand end was written by proxies we trust;
a client can write anything on the left. Walking from the right, every entry that is a trusted
proxy is skipped and the first one that is not is the client. An entry that is not an IP
address stops the walk (no proxy of ours wrote it), and so does the ``MAX_HOPS``-th trusted
one: the client is then the last address the walk accepted. All the header's lines count, in
order (RFC 9110 §5.3). Without trust configured, or on a connection from elsewhere, the client
is the connection's address and the header is ignored (and then rebuilt by
``headers.rewrite_request_headers``, as always).
"""

from __future__ import annotations

import functools
import ipaddress
from collections.abc import Iterable

from gateway.wire.http1 import RequestHead

Network = ipaddress.IPv4Network | ipaddress.IPv6Network
MAX_HOPS = 16  # trusted proxies skipped at most, walking from the right


def parse_networks(values: Iterable[str], flag: str) -> tuple[Network, ...]:
    """CIDRs (or single addresses) as networks; ValueError naming ``flag`` otherwise."""
    networks: list[Network] = []
    for value in values:
        for item in value.split(","):
            text = item.strip()
            if not text:
                continue
            try:
                networks.append(ipaddress.ip_network(text, strict=False))
            except ValueError:
                raise ValueError(f"{flag} {text!r}: not an address or CIDR") from None
    return tuple(networks)


def _address(text: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address | None:
    try:
        address = ipaddress.ip_address(text)
    except ValueError:
        return None
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        return address.ipv4_mapped  # a dual-stack socket's view of an IPv4 peer
    return address


@functools.lru_cache(maxsize=4096)  # a few balancers and clients, each seen many times
def trusts(networks: tuple[Network, ...], ip: str) -> bool:
    """Whether ``ip`` is in one of ``networks`` (IPv4-mapped IPv6 counts as its IPv4)."""
    address = _address(ip)
    return address is not None and any(address in network for network in networks)


def forwarded_entry(text: str) -> str | None:
    """The address of one ``X-Forwarded-For`` element, or None if it is not one. Accepts an
    optional port (``192.0.2.1:4711``, ``[2001:db8::1]:4711``), as some balancers add it."""
    text = text.strip()
    if text.startswith("["):
        host, bracket, _ = text[1:].partition("]")
        text = host if bracket else ""
    elif text.count(":") == 1:
        text = text.partition(":")[0]
    address = _address(text)
    return None if address is None else str(address)


def client_address(peer: str, head: RequestHead, trusted: tuple[Network, ...]) -> str:
    """The request's real client: ``peer`` (the connection's client address) unless ``peer``
    is a trusted proxy; then the right-most untrusted ``X-Forwarded-For`` entry (see the module
    docstring)."""
    if not trusted or not trusts(trusted, peer):
        return peer
    values = head.get_all(b"x-forwarded-for")
    if not values:
        return peer
    entries = b",".join(values).decode("latin-1").split(",")
    client = peer
    for hops, entry in enumerate(reversed(entries)):
        address = forwarded_entry(entry)
        if address is None or hops >= MAX_HOPS:
            break
        client = address
        if not trusts(trusted, address):
            break
    return client


def source_ips(client: str, connection_client: str, peer: str) -> tuple[str, ...]:
    """A request's addresses for the audit trail: its client, then the proxies it came through
    (the connection's PROXY-header client and its peer), each once, in that order."""
    if client == connection_client == peer:  # no proxy: every request, so the short way
        return (client,) if client != "unknown" else ()
    return tuple(dict.fromkeys(ip for ip in (client, connection_client, peer)
                               if ip and ip != "unknown"))
