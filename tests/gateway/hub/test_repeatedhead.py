"""A head whose fields repeat the last one's (``gateway.wire.repeatedhead``) reads exactly as
``parse_request_head`` reads it -- the same head, or the same refusal -- and the HTTP/1.1 front
door judges every request line on its own over a real TLS connection."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gateway.wire.http1 import DEFAULT_LIMITS, HTTPError, Limits, parse_request_head
from gateway.wire.repeatedhead import RepeatedHead
from tests.gateway.hub.test_frontdoor_harness import (
    Harness,
    get,
    read_response,
    status_of,
    tls,  # noqa: F401  (fixture)
)
from tests.gateway.hub.test_frontdoor_harness import gw as gw

pytestmark = pytest.mark.timeout(30)

FIELDS = (b"\r\nHost: gw\r\nAuthorization: Bearer abc\r\nAccept: application/json\r\n"
          b"Content-Length: 3\r\nConnection: keep-alive\r\n\r\n")


def _outcome(parse: object, data: bytes, limits: Limits) -> object:
    try:
        return parse(data, limits)  # type: ignore[operator]
    except HTTPError as exc:
        return ("refused", exc.status)


def _agrees(heads: RepeatedHead, data: bytes, limits: Limits = DEFAULT_LIMITS) -> object:
    expected = _outcome(parse_request_head, data, limits)
    assert _outcome(heads.parse, data, limits) == expected
    return expected


def test_a_repeated_head_takes_its_fields_from_the_last_and_its_own_request_line() -> None:
    heads = RepeatedHead()
    first = _agrees(heads, b"GET /a HTTP/1.1" + FIELDS)
    again = _agrees(heads, b"PUT /b?x=1 HTTP/1.1" + FIELDS)
    assert (again.method, again.target, again.content_length) == (b"PUT", b"/b?x=1", 3)
    assert again.headers == first.headers and again.headers is not first.headers
    # The parsed head's lists may be emptied later (a watch): the kept copy is not.
    again.headers.clear()
    assert _agrees(heads, b"GET /c HTTP/1.1" + FIELDS).headers == first.headers


@pytest.mark.parametrize("line", [
    b"GET /a b HTTP/1.1", b"GET  /a HTTP/1.1", b"GET /a HTTP/1.1 ", b"G(T /a HTTP/1.1",
    b" /a HTTP/1.1", b"GET /\x7f HTTP/1.1", b"GET /\xe9 HTTP/1.1", b"GET /a\tb HTTP/1.1",
    b"GET /a HTTP/1.0", b"GET /a HTTP/2.0", b"GET /a HTTP/1.10", b"GET /a", b"CONNECT /a HTTP/1.1",
    b"GET /" + b"a" * 100 + b" HTTP/1.1", b"\r\nGET /a HTTP/1.1",
])
def test_a_request_line_that_breaks_a_rule_is_refused_as_the_parser_refuses_it(
        line: bytes) -> None:
    heads = RepeatedHead()
    _agrees(heads, b"GET /a HTTP/1.1" + FIELDS)
    limits = Limits(max_request_line=64)
    _agrees(heads, line + FIELDS, limits)
    _agrees(heads, b"GET /a HTTP/1.1" + FIELDS)


_LINES = st.builds(lambda m, t, v: b" ".join((m, t, v)),
                   st.sampled_from([b"GET", b"POST", b"G T", b"", b"G\x00T", b"CONNECT"]),
                   st.binary(max_size=12).map(lambda b: b"/" + b),
                   st.sampled_from([b"HTTP/1.1", b"HTTP/1.0", b"HTTP/1.2", b"http/1.1"]))
_FIELD_SETS = st.sampled_from([
    FIELDS, b"\r\n\r\n", b"\r\nHost: gw\r\n\r\n", b"\r\nHost: gw\r\nHost: gw\r\n\r\n",
    b"\r\nHost: gw\r\nTransfer-Encoding: chunked\r\n\r\n",
    b"\r\nHost: gw\r\nConnection: close\r\nExpect: 100-continue\r\n\r\n",
    b"\r\nHost: gw\r\nConnection: upgrade\r\nUpgrade: websocket\r\n\r\n",
    b"\r\nHost: gw\r\nX: a\rb\r\n\r\n", b"\r\nHost: gw\r\n folded\r\n\r\n",
])


@settings(max_examples=1000, deadline=None)
@given(st.lists(st.tuples(_LINES, _FIELD_SETS), min_size=1, max_size=6))
def test_a_connection_of_heads_reads_as_the_parser_reads_each(
        heads_sent: list[tuple[bytes, bytes]]) -> None:
    heads = RepeatedHead()
    for line, fields in heads_sent:
        _agrees(heads, line + fields)


async def test_each_request_on_a_connection_is_read_on_its_own_request_line(
        gw: Harness) -> None:
    reader, writer = await gw.open()
    for target in ("/c1/api/v1/pods", "/c1/version"):
        writer.write(get(target))
        status, _, body = await read_response(reader)
        assert status == 200 and json.loads(body)["target"] == target[3:]
    # The same fields with a request line that breaks a rule: 400, as any such head.
    writer.write(get("/c1/version").replace(b"GET /c1/version", b"GET /c1/a b", 1))
    status, _ = status_of(await reader.read())
    assert status == 400
    writer.close()


async def test_a_connection_that_streams_forgets_its_last_head(gw: Harness) -> None:
    reader, writer = await gw.open()
    writer.write(get("/c1/api/v1/pods"))
    assert (await read_response(reader))[0] == 200
    door = next(iter(gw.gateway.connections))
    assert door.heads._head is not None
    writer.write(get("/c1/api/v1/pods?watch=1"))
    await reader.readuntil(b"\r\n\r\n")
    assert door.heads._head is None and door.heads._fields == b""
    writer.close()
