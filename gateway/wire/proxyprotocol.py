"""The PROXY protocol header, versions 1 and 2, receiver side (sans-IO).

A load balancer that forwards TCP (HAProxy ``send-proxy``/``send-proxy-v2``, AWS NLB, ...)
writes one header at the start of each connection, before any byte of the client's, saying
which address the connection really came from. The front door reads it *before* TLS (the
header is not encrypted), then starts TLS on the rest. Specification: HAProxy's
``proxy-protocol.txt`` (Debian: ``/usr/share/doc/haproxy/proxy-protocol.txt.gz``).

:func:`parse_header` takes the bytes received so far and returns:

* a :class:`ProxyHeader` (``length`` bytes long; the client's bytes start after them), or
* ``None``: incomplete. Every byte given belongs to the header then, so a reader may consume
  them all and wait for more without ever reading past the header's end (see
  :mod:`gateway.hub.proxyaccept`, which must leave the TLS ClientHello in the socket).

and raises :class:`ProxyProtocolError` (its ``reason`` one of :data:`REASONS`) for anything the
specification says to drop: a connection that does not start with either signature
(``missing``), a version-1 line that breaks the grammar, a single CR or LF, a header past
:data:`MAX_HEADER_BYTES`, an unknown version, command, family or protocol nibble, or an address
block shorter than its family needs (``malformed``/``oversized``).

What the receiver uses, per the specification: the source address and port for ``PROXY``
over TCP4/TCP6 (v1) or AF_INET/AF_INET6 (v2); the connection's own endpoints (``source``
None) for a v2 ``LOCAL`` command (the balancer's health checks), a v1 ``UNKNOWN`` family and
the v2 families and protocols this server does not speak (AF_UNSPEC, AF_UNIX, DGRAM). Version 2
type-length-value fields after the addresses are skipped.
"""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass

V1_PREFIX = b"PROXY "
V2_SIGNATURE = b"\r\n\r\n\x00\r\nQUIT\n"
V1_MAX_LINE = 107  # the specification's worst case, CRLF included
V2_FIXED = 16  # signature, version/command, family/protocol, length
# Version 2 allows 16 + 65535 bytes; load balancers send the addresses and a few TLVs (an AWS
# VPC endpoint id, an HAProxy unique id). Past this the connection is refused: nobody makes
# the gateway buffer 64 KiB before TLS.
MAX_HEADER_BYTES = 4096

LOCAL = "LOCAL"
PROXY = "PROXY"

MISSING = "missing"
MALFORMED = "malformed"
OVERSIZED = "oversized"
REASONS = (MISSING, MALFORMED, OVERSIZED)

_V1_FAMILIES = {b"TCP4": 4, b"TCP6": 6}
_V2_ADDRESS_LENGTH = {0x11: 12, 0x21: 36}  # TCP over IPv4, TCP over IPv6
_V2_FAMILIES = (0x0, 0x1, 0x2, 0x3)  # AF_UNSPEC, AF_INET, AF_INET6, AF_UNIX
_V2_PROTOCOLS = (0x0, 0x1, 0x2)  # UNSPEC, STREAM, DGRAM
_DIGITS = frozenset(b"0123456789")


class ProxyProtocolError(ValueError):
    """The connection's first bytes are not an acceptable PROXY header; drop it."""

    def __init__(self, message: str, reason: str = MALFORMED) -> None:
        super().__init__(message)
        self.reason = reason


@dataclass(frozen=True, slots=True)
class ProxyHeader:
    """A complete header: ``length`` bytes; ``source`` None means "use the connection's own
    peer address" (LOCAL, UNKNOWN, or a family this server does not speak)."""

    version: int
    command: str
    length: int
    source: tuple[str, int] | None = None
    destination: tuple[str, int] | None = None


def could_be_header(data: bytes) -> bool:
    """Whether ``data`` (at least one byte) starts like either signature. A TLS ClientHello
    starts with 0x16, so one byte tells them apart."""
    if not data:
        return False
    n = min(len(data), len(V2_SIGNATURE))
    if data[:n] == V2_SIGNATURE[:n]:
        return True
    n = min(len(data), len(V1_PREFIX))
    return data[:n] == V1_PREFIX[:n]


def parse_header(data: bytes) -> ProxyHeader | None:
    """The header at the start of ``data``, or None if more bytes are needed (every byte of
    ``data`` is then part of the header). Raises :class:`ProxyProtocolError`."""
    if not data:
        return None
    n = min(len(data), len(V2_SIGNATURE))
    if data[:n] == V2_SIGNATURE[:n]:
        return _parse_v2(data) if len(data) >= V2_FIXED else None
    n = min(len(data), len(V1_PREFIX))
    if data[:n] == V1_PREFIX[:n]:
        return _parse_v1(data)
    raise ProxyProtocolError("the connection does not start with a PROXY protocol header",
                             MISSING)


# --- version 1: one line of text ------------------------------------------------------------


def _parse_v1(data: bytes) -> ProxyHeader | None:
    end = data.find(b"\r\n", 0, V1_MAX_LINE)
    if end < 0:
        # A bare CR or LF never ends the line; anything else may still be a prefix of it.
        stray = data.find(b"\n", 0, V1_MAX_LINE)
        cr = data.find(b"\r", 0, V1_MAX_LINE)
        if stray >= 0 or (cr >= 0 and cr + 1 < min(len(data), V1_MAX_LINE)):
            raise ProxyProtocolError("PROXY v1 line not ended by CRLF")
        if len(data) >= V1_MAX_LINE:
            raise ProxyProtocolError(f"PROXY v1 line longer than {V1_MAX_LINE} bytes",
                                     OVERSIZED)
        return None
    line = data[:end]
    if b"\r" in line or b"\n" in line:
        raise ProxyProtocolError("PROXY v1 line not ended by CRLF")
    fields = line.split(b" ")
    if len(fields) >= 2 and fields[1] == b"UNKNOWN":
        # "the receiver must ignore anything presented before the CRLF is found"
        return ProxyHeader(1, PROXY, end + 2)
    if len(fields) != 6:
        raise ProxyProtocolError("PROXY v1 line: expected 'PROXY TCP4|TCP6 SRC DST SPORT DPORT'")
    _, family, source, destination, source_port, destination_port = fields
    version = _V1_FAMILIES.get(family)
    if version is None:
        raise ProxyProtocolError("PROXY v1 line: unknown protocol family")
    return ProxyHeader(1, PROXY, end + 2,
                       (_v1_address(source, version), _v1_port(source_port)),
                       (_v1_address(destination, version), _v1_port(destination_port)))


def _v1_address(text: bytes, version: int) -> str:
    if b"%" in text:  # an IPv6 zone: not an address a peer can have reached us from
        raise ProxyProtocolError("PROXY v1 line: invalid address")
    try:
        address = ipaddress.ip_address(text.decode("ascii"))
    except (UnicodeDecodeError, ValueError):
        raise ProxyProtocolError("PROXY v1 line: invalid address") from None
    if address.version != version:
        raise ProxyProtocolError("PROXY v1 line: address of another family")
    # ipaddress already refuses leading zeros in IPv4 (octal confusion, as the spec says).
    return str(address)


def _v1_port(text: bytes) -> int:
    if not text or not set(text) <= _DIGITS or (len(text) > 1 and text[0:1] == b"0"):
        raise ProxyProtocolError("PROXY v1 line: invalid port")
    port = int(text)
    if port > 65535:
        raise ProxyProtocolError("PROXY v1 line: invalid port")
    return port


# --- version 2: binary ----------------------------------------------------------------------


def _parse_v2(data: bytes) -> ProxyHeader | None:
    if data[:12] != V2_SIGNATURE:
        raise ProxyProtocolError("PROXY v2: broken signature")
    version, command = data[12] >> 4, data[12] & 0x0F
    if version != 2:
        raise ProxyProtocolError("PROXY v2: unknown version")
    if command not in (0, 1):
        raise ProxyProtocolError("PROXY v2: unknown command")
    family, protocol = data[13] >> 4, data[13] & 0x0F
    if family not in _V2_FAMILIES or protocol not in _V2_PROTOCOLS:
        raise ProxyProtocolError("PROXY v2: unknown address family or protocol")
    length = V2_FIXED + int.from_bytes(data[14:16], "big")
    if length > MAX_HEADER_BYTES:
        raise ProxyProtocolError(f"PROXY v2 header longer than {MAX_HEADER_BYTES} bytes",
                                 OVERSIZED)
    if len(data) < length:
        return None
    if command == 0:  # LOCAL: the balancer's own connection; addresses ignored
        return ProxyHeader(2, LOCAL, length)
    needed = _V2_ADDRESS_LENGTH.get(data[13])
    if needed is None:  # UNSPEC, UNIX or DGRAM: use the connection's endpoints
        return ProxyHeader(2, PROXY, length)
    if length - V2_FIXED < needed:
        raise ProxyProtocolError("PROXY v2: address block shorter than its family needs")
    block = data[V2_FIXED:V2_FIXED + needed]
    size = 4 if data[13] == 0x11 else 16
    source = ipaddress.ip_address(block[:size])
    destination = ipaddress.ip_address(block[size:2 * size])
    ports = block[2 * size:]
    return ProxyHeader(2, PROXY, length,
                       (str(source), int.from_bytes(ports[:2], "big")),
                       (str(destination), int.from_bytes(ports[2:4], "big")))


# --- building headers (tests and tools) -----------------------------------------------------


def v1_header(source: tuple[str, int], destination: tuple[str, int]) -> bytes:
    """A version-1 line for a TCP connection from ``source`` to ``destination``."""
    family = "TCP6" if ipaddress.ip_address(source[0]).version == 6 else "TCP4"
    return (f"PROXY {family} {source[0]} {destination[0]} {source[1]} {destination[1]}\r\n"
            .encode("ascii"))


def v2_header(source: tuple[str, int] | None, destination: tuple[str, int] | None = None,
              *, command: int = 1, tlvs: bytes = b"") -> bytes:
    """A version-2 header: PROXY over TCP (``source`` given) or LOCAL/UNSPEC (None)."""
    if source is None:
        return V2_SIGNATURE + bytes([0x20 | command, 0x00]) + len(tlvs).to_bytes(2, "big") + tlvs
    src = ipaddress.ip_address(source[0])
    dst = ipaddress.ip_address((destination or ("0.0.0.0" if src.version == 4 else "::", 0))[0])
    dport = destination[1] if destination else 0
    block = (src.packed + dst.packed + source[1].to_bytes(2, "big") + dport.to_bytes(2, "big")
             + tlvs)
    fam = 0x11 if src.version == 4 else 0x21
    return V2_SIGNATURE + bytes([0x20 | command, fam]) + len(block).to_bytes(2, "big") + block
