"""The framing-only reading of a relayed response head (``gateway.hub.relayhead``) agrees with
the one parser of the rules, ``parse_response_head``: it never accepts a head that parser
refuses, never reads other framing from one it accepts, and leaves every case it does not
handle to that parser."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gateway.hub.exchange import RESPONSE_LIMITS
from gateway.hub.relayhead import MAX_RELAYED_HEAD, relayed_head
from gateway.wire.http1 import HTTPError, framing_for_response, parse_response_head

PLAIN = (b"HTTP/1.1 200 OK\r\nAudit-Id: 2d8b7b0e\r\nContent-Type: application/json\r\n"
         b"Date: Fri, 27 Nov 2026 18:00:00 GMT\r\nContent-Length: 1234\r\n\r\n")


def _agrees(raw: bytes) -> None:
    fast = relayed_head(raw)
    if fast is None:
        return
    full = parse_response_head(raw, RESPONSE_LIMITS)  # raises if the fast one was wrong
    assert (fast.version, fast.status, fast.reason, fast.content_length, fast.chunked,
            fast.close_delimited, fast.keep_alive) == (
        full.version, full.status, full.reason, full.content_length, full.chunked,
        full.close_delimited, full.keep_alive)
    for method in (b"GET", b"HEAD"):
        assert type(framing_for_response(fast, method)) is type(framing_for_response(full, method))


def test_the_plain_answer_is_read_without_its_fields() -> None:
    head = relayed_head(PLAIN)
    assert head is not None and (head.status, head.reason, head.content_length) == (
        200, b"OK", 1234)
    assert head.headers == [] and head.keep_alive
    _agrees(PLAIN)
    head = relayed_head(b"HTTP/1.1 404\r\ncontent-length:  7 \r\n\r\n")
    assert head is not None and (head.status, head.reason, head.content_length) == (404, b"", 7)


@pytest.mark.parametrize("raw", [
    # other framing, or a connection header: the full parser decides
    PLAIN.replace(b"Content-Length: 1234", b"Transfer-Encoding: chunked"),
    PLAIN.replace(b"Date:", b"Connection: close\r\nDate:"),
    PLAIN.replace(b"Content-Length: 1234\r\n", b""),
    PLAIN.replace(b"Date:", b"content-length: 1234\r\nDate:"),
    PLAIN.replace(b"HTTP/1.1", b"HTTP/1.0"),
    PLAIN.replace(b"200 OK", b"101 Switching Protocols"),
    PLAIN.replace(b"200 OK", b"100 Continue"),
    PLAIN.replace(b"Date:", b"X-Big: " + b"a" * MAX_RELAYED_HEAD + b"\r\nDate:"),
    # broken heads: left to the parser, which refuses them
    PLAIN.replace(b"1234", b"+1234"),
    PLAIN.replace(b"1234", b"12,34"),
    PLAIN.replace(b"Content-Length:", b"Content-Length :"),
    PLAIN.replace(b"Audit-Id: 2d8b7b0e\r\n", b"Audit-Id: 2d8b\r\n 7b0e\r\n"),
    PLAIN.replace(b"Audit-Id: 2d8b7b0e", b"Audit-Id: 2d8b\n7b0e"),
    PLAIN.replace(b"Audit-Id: 2d8b7b0e", b"Audit-Id: 2d8b\r7b0e"),
    PLAIN.replace(b"Audit-Id: 2d8b7b0e", b"Audit-Id: 2d8b\x007b0e"),
    PLAIN.replace(b"Audit-Id: 2d8b7b0e", b"Audit-Id: 2d8b\x7f7b0e"),
    PLAIN.replace(b"Audit-Id:", b"Audit Id:"),
    PLAIN.replace(b"Audit-Id:", b":"),
    PLAIN.replace(b"200 OK", b"200OK"),
    PLAIN.replace(b"200 OK", b"099 OK"),
    PLAIN.replace(b"200 OK", b"20 OK"),
    PLAIN.replace(b"200 OK", b"2000 OK"),
    PLAIN.replace(b"OK\r\n", b"OK\x01\r\n"),
    PLAIN[:-2],
])
def test_anything_else_is_left_to_the_parser(raw: bytes) -> None:
    assert relayed_head(raw) is None


_BYTES = st.sampled_from([b"a", b"Z", b"0", b"-", b":", b" ", b"\t", b"\r", b"\n", b"\r\n",
                          b"\x00", b"\x7f", b"\xe9", b",", b"+", b"content-length",
                          b"Content-Length: 5", b"Transfer-Encoding: chunked", b"connection",
                          b"HTTP/1.1 ", b"200", b"\r\n\r\n"])


@settings(max_examples=1000, deadline=None)
@given(st.lists(_BYTES, max_size=24))
def test_it_never_disagrees_with_the_parser_on_mutated_heads(parts: list[bytes]) -> None:
    raw = b"".join(parts)
    for candidate in (raw, PLAIN[:40] + raw + b"\r\n\r\n", PLAIN[:-4] + b"\r\n" + raw + b"\r\n\r\n",
                      b"HTTP/1.1 200 OK\r\n" + raw + b"\r\n\r\n"):
        try:
            parse_response_head(candidate, RESPONSE_LIMITS)
        except HTTPError:
            assert relayed_head(candidate) is None
            continue
        _agrees(candidate)
