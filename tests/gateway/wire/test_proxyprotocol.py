"""The PROXY protocol receiver, byte by byte (gateway.wire.proxyprotocol).

Every complete header is also fed one byte at a time: each proper prefix must be "incomplete"
(None), never a header and never an error, so a reader that consumes what it was given never
reads past the header into the TLS ClientHello.
"""

from __future__ import annotations

import pytest

from gateway.wire.proxyprotocol import (
    LOCAL,
    MALFORMED,
    MAX_HEADER_BYTES,
    MISSING,
    OVERSIZED,
    PROXY,
    V2_SIGNATURE,
    ProxyHeader,
    ProxyProtocolError,
    could_be_header,
    parse_header,
    v1_header,
    v2_header,
)

CLIENT_HELLO = b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03"


def parsed(data: bytes) -> ProxyHeader:
    """The header of ``data`` (+ a ClientHello after it); every shorter prefix incomplete."""
    for end in range(len(data)):
        assert parse_header(data[:end]) is None, f"prefix of {end} bytes"
    header = parse_header(data + CLIENT_HELLO)
    assert header is not None and header.length == len(data)
    assert parse_header(data) == header
    return header


def refused(data: bytes) -> str:
    with pytest.raises(ProxyProtocolError) as caught:
        parse_header(data)
    return caught.value.reason


# --- version 1 ------------------------------------------------------------------------------


def test_v1_tcp4() -> None:
    header = parsed(b"PROXY TCP4 192.0.2.7 10.0.0.1 56324 443\r\n")
    assert header == ProxyHeader(1, PROXY, 41, ("192.0.2.7", 56324), ("10.0.0.1", 443))


def test_v1_tcp6_longest_line() -> None:
    full = "ffff:ffff:ffff:ffff:ffff:ffff:ffff:ffff"
    line = f"PROXY TCP6 {full} {full} 65535 65535\r\n".encode()
    assert len(line) == 104
    header = parsed(line)
    assert header.source == (full, 65535)


def test_v1_tcp6_compressed_address() -> None:
    assert parsed(b"PROXY TCP6 2001:db8::1 ::1 1 443\r\n").source == ("2001:db8::1", 1)


def test_v1_unknown_uses_the_connection_and_ignores_the_rest_of_the_line() -> None:
    assert parsed(b"PROXY UNKNOWN\r\n") == ProxyHeader(1, PROXY, 15)
    worst = b"PROXY UNKNOWN " + b"f" * 91 + b"\r\n"  # 107 bytes: the longest allowed
    assert len(worst) == 107
    assert parsed(worst) == ProxyHeader(1, PROXY, 107)


def test_v1_builder_round_trips() -> None:
    assert parsed(v1_header(("203.0.113.9", 4000), ("127.0.0.1", 9092))).source == (
        "203.0.113.9", 4000)


@pytest.mark.parametrize("line", [
    b"PROXY TCP4 192.0.2.7 10.0.0.1 56324 443\n",  # bare LF
    b"PROXY TCP4 192.0.2.7 10.0.0.1 56324 443\rX\r\n",  # CR not followed by LF
    b"PROXY TCP4 192.0.2.7 10.0.0.1 56324\r\n",  # a field missing
    b"PROXY TCP4 192.0.2.7 10.0.0.1 56324 443 1\r\n",  # one too many
    b"PROXY TCP4  192.0.2.7 10.0.0.1 56324 443\r\n",  # two spaces
    b"PROXY TCP5 192.0.2.7 10.0.0.1 56324 443\r\n",  # unknown family
    b"PROXY tcp4 192.0.2.7 10.0.0.1 56324 443\r\n",  # case matters
    b"PROXY TCP4 192.0.2.07 10.0.0.1 56324 443\r\n",  # leading zero (octal?)
    b"PROXY TCP4 192.0.2.256 10.0.0.1 56324 443\r\n",  # out of range
    b"PROXY TCP4 2001:db8::1 10.0.0.1 56324 443\r\n",  # IPv6 in TCP4
    b"PROXY TCP6 192.0.2.7 ::1 56324 443\r\n",  # IPv4 in TCP6
    b"PROXY TCP6 fe80::1%eth0 ::1 56324 443\r\n",  # a zone
    b"PROXY TCP4 192.0.2.7 10.0.0.1 056324 443\r\n",  # leading zero in a port
    b"PROXY TCP4 192.0.2.7 10.0.0.1 65536 443\r\n",  # port out of range
    b"PROXY TCP4 192.0.2.7 10.0.0.1 -1 443\r\n",
    b"PROXY TCP4 192.0.2.7 10.0.0.1 +1 443\r\n",
    b"PROXY TCP4 192.0.2.7 10.0.0.1 \xd9\xa1 443\r\n",  # a non-ASCII digit
    b"PROXY TCP4 \xff.0.0.1 10.0.0.1 1 443\r\n",
    b"PROXY \r\n",
])
def test_v1_malformed(line: bytes) -> None:
    assert refused(line) == MALFORMED


def test_v1_without_crlf_in_107_bytes_is_oversized() -> None:
    line = b"PROXY UNKNOWN " + b"f" * 93  # 107 bytes, no CRLF yet
    assert refused(line) == OVERSIZED
    assert parse_header(line[:-1]) is None  # one byte less: still waiting


# --- version 2 ------------------------------------------------------------------------------


def test_v2_tcp4() -> None:
    data = (V2_SIGNATURE + b"\x21\x11\x00\x0c" + bytes([203, 0, 113, 9]) + bytes([10, 0, 0, 1])
            + (40000).to_bytes(2, "big") + (9092).to_bytes(2, "big"))
    assert parsed(data) == ProxyHeader(2, PROXY, 28, ("203.0.113.9", 40000), ("10.0.0.1", 9092))


def test_v2_tcp6() -> None:
    header = parsed(v2_header(("2001:db8::7", 1234), ("2001:db8::1", 443)))
    assert header == ProxyHeader(2, PROXY, 52, ("2001:db8::7", 1234), ("2001:db8::1", 443))


def test_v2_tlvs_after_the_addresses_are_skipped() -> None:
    tlvs = b"\x05\x00\x04abcd" + b"\xea\x00\x16" + b"\x01vpce-0123456789abcdef0"[:22]
    header = parsed(v2_header(("198.51.100.1", 5), ("10.0.0.1", 443), tlvs=tlvs))
    assert header.source == ("198.51.100.1", 5)
    assert header.length == 16 + 12 + len(tlvs)


def test_v2_local_uses_the_connection_whatever_the_block_says() -> None:
    assert parsed(v2_header(None, command=0)) == ProxyHeader(2, LOCAL, 16)
    # LOCAL with an address block (allowed; the receiver must skip it)
    local = v2_header(("192.0.2.1", 1), ("192.0.2.2", 2), command=0)
    assert parsed(local) == ProxyHeader(2, LOCAL, 28)


@pytest.mark.parametrize("fam", [0x00, 0x31, 0x32, 0x12, 0x22, 0x10, 0x01])
def test_v2_families_we_do_not_speak_fall_back_to_the_connection(fam: int) -> None:
    # AF_UNSPEC, UNIX stream/dgram, UDP: "fall back to the UNSPEC mode" (use the real peer).
    block = bytes(216)
    data = V2_SIGNATURE + bytes([0x21, fam]) + len(block).to_bytes(2, "big") + block
    assert parsed(data) == ProxyHeader(2, PROXY, 16 + 216)


@pytest.mark.parametrize(("version_command", "fam"), [
    (0x11, 0x11),  # version 1 in a binary header
    (0x31, 0x11),  # version 3
    (0x22, 0x11),  # command 2
    (0x2F, 0x11),  # command 15
    (0x21, 0x41),  # family 4
    (0x21, 0x13),  # protocol 3
    (0x21, 0xF1),
])
def test_v2_unknown_nibbles_are_refused(version_command: int, fam: int) -> None:
    data = V2_SIGNATURE + bytes([version_command, fam]) + b"\x00\x0c" + bytes(12)
    assert refused(data) == MALFORMED


def test_v2_address_block_shorter_than_its_family() -> None:
    assert refused(V2_SIGNATURE + b"\x21\x11\x00\x0b" + bytes(11)) == MALFORMED
    assert refused(V2_SIGNATURE + b"\x21\x21\x00\x0c" + bytes(12)) == MALFORMED


def test_v2_oversized_is_refused_from_its_length_field_alone() -> None:
    too_long = MAX_HEADER_BYTES - 16 + 1
    head = V2_SIGNATURE + b"\x21\x11" + too_long.to_bytes(2, "big")
    assert refused(head) == OVERSIZED  # before a byte of the body arrives
    assert refused(V2_SIGNATURE + b"\x21\x11\xff\xff") == OVERSIZED
    largest = V2_SIGNATURE + b"\x21\x11" + (MAX_HEADER_BYTES - 16).to_bytes(2, "big")
    assert parse_header(largest) is None  # allowed: waits for its bytes


def test_v2_broken_signature_after_a_matching_start() -> None:
    assert refused(V2_SIGNATURE[:11] + b"X" + b"\x21\x11\x00\x00") == MISSING


def test_v2_truncated_is_incomplete_not_a_header() -> None:
    full = v2_header(("192.0.2.1", 1), ("192.0.2.2", 2))
    for end in (0, 1, 11, 12, 15, 16, 27):
        assert parse_header(full[:end]) is None


# --- neither --------------------------------------------------------------------------------


@pytest.mark.parametrize("data", [
    CLIENT_HELLO,  # a TLS client that was not told about the balancer
    b"GET / HTTP/1.1\r\n",
    b"PRI * HTTP/2.0\r\n",
    b"PROXYX",
    b"\r\n\r\n\r\n",
    b"\x00",
])
def test_anything_else_is_a_missing_header(data: bytes) -> None:
    assert refused(data) == MISSING


def test_could_be_header_needs_one_byte() -> None:
    assert could_be_header(b"P") and could_be_header(b"\r") and could_be_header(b"PROXY TCP4")
    assert could_be_header(V2_SIGNATURE + b"\x21")
    assert not could_be_header(CLIENT_HELLO[:1])
    assert not could_be_header(b"")
    assert not could_be_header(b"PRI * HTTP/2.0")
