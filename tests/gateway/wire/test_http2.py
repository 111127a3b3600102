"""gateway.wire.http2: HTTP/2 heads to the protocol-neutral RequestHead, HTTP/1.1 responses to
HTTP/2 fields and payload. Pure: fields in, heads and bytes out."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gateway.hub.relayhead import relayed_head, whole_response
from gateway.wire.http1 import (
    DEFAULT_LIMITS,
    HTTPError,
    Limits,
    parse_request_head,
    parse_response_head,
)
from gateway.wire.http2 import (
    FieldsMemo,
    H2RequestError,
    ResponseStart,
    ResponseTranslator,
    chunk,
    relayed_fields,
    request_head_from_h2,
    response_fields,
)

BASE = [(b":method", b"GET"), (b":scheme", b"https"), (b":authority", b"gw.example:9092"),
        (b":path", b"/c1/api/v1/pods?watch=1")]


def head(extra: list[tuple[bytes, bytes]] = (), *, fields: list | None = None,  # type: ignore[assignment]
         end_stream: bool = True, limits: Limits = DEFAULT_LIMITS):  # type: ignore[no-untyped-def]
    return request_head_from_h2((fields if fields is not None else BASE) + list(extra), limits,
                                end_stream=end_stream)


def test_same_head_as_http1() -> None:
    h2head = head([(b"authorization", b"Bearer t"), (b"accept", b"application/json")])
    h1head = parse_request_head(b"GET /c1/api/v1/pods?watch=1 HTTP/1.1\r\n"
                                b"Host: gw.example:9092\r\nAuthorization: Bearer t\r\n"
                                b"Accept: application/json\r\n\r\n")
    assert (h2head.method, h2head.target, h2head.version) == (h1head.method, h1head.target,
                                                                h1head.version)
    assert h2head.names == h1head.names
    assert [v for _, v in h2head.headers] == [v for _, v in h1head.headers]
    assert h2head.host == b"gw.example:9092"
    assert h2head.content_length is None and not h2head.chunked and h2head.upgrade is None


def test_host_equal_to_authority_travels_once() -> None:
    h = head([(b"host", b"gw.example:9092")])
    assert h.get_all(b"host") == [b"gw.example:9092"]


def test_host_differing_from_authority_is_malformed() -> None:
    """RFC 9113 §8.3.1: two authorities for one request; which one the agent's apiserver would
    believe is not ours to guess."""
    with pytest.raises(H2RequestError) as err:
        head([(b"host", b"other")])
    assert err.value.status == 400


@pytest.mark.parametrize("fields", [
    [*BASE, (b"x-upper", b"1"), (b"X-Upper", b"1")],
    [*BASE, (b"connection", b"keep-alive")],
    [*BASE, (b"keep-alive", b"timeout=5")],
    [*BASE, (b"proxy-connection", b"keep-alive")],
    [*BASE, (b"transfer-encoding", b"chunked")],
    [*BASE, (b"upgrade", b"websocket")],
    [*BASE, (b"te", b"gzip")],
    [*BASE, (b":protocol", b"websocket")],
    [*BASE, (b":status", b"200")],
    [*BASE, (b":path", b"/c1/version")],
    [*BASE[:3], (b"accept", b"*/*"), BASE[3]],
    [BASE[0], BASE[2], BASE[3]],
    [BASE[1], BASE[2], BASE[3]],
    [*BASE, (b"x-a", b" v")],
    [*BASE, (b"x-a", b"v\t")],
    [*BASE, (b"", b"v")],
    [*BASE, (b"x-a:b", b"v")],
    [*BASE, (b"x-\xff", b"v")],
], ids=["upper-case-name", "connection", "keep-alive", "proxy-connection", "transfer-encoding",
        "upgrade", "te-gzip", "protocol-pseudo", "status-pseudo", "repeated-path",
        "pseudo-after-regular", "no-scheme", "no-method", "space-before-value",
        "tab-after-value", "empty-name", "colon-in-name", "non-ascii-name"])
def test_malformed_requests_rfc9113(fields: list[tuple[bytes, bytes]]) -> None:
    """RFC 9113 §8.2-8.3, checked here since h2's own validation is off in the front door:
    each of these is a 400 and never becomes an HTTP/1.1 head."""
    with pytest.raises(H2RequestError) as err:
        head(fields=fields)
    assert err.value.status == 400


def _with(name: bytes, value: bytes) -> list[tuple[bytes, bytes]]:
    return [(n, value if n == name else v) for n, v in BASE]


@pytest.mark.parametrize("fields", [
    _with(b":scheme", b"https\r\nimpersonate-user: admin"),
    _with(b":scheme", b"ftp"),
    _with(b":scheme", b"HTTPS"),
    _with(b":scheme", b""),
    _with(b":scheme", b"https "),
    _with(b":method", b"GET\r\nX"),
    _with(b":path", b"/c1/version\n"),
    _with(b":authority", b"gw\x00.example"),
    _with(b":authority", b"gw\x7f"),
], ids=["crlf-in-scheme", "scheme-ftp", "scheme-upper-case", "scheme-empty",
        "scheme-trailing-space", "crlf-in-method", "lf-in-path", "nul-in-authority",
        "del-in-authority"])
def test_malformed_pseudo_header_values(fields: list[tuple[bytes, bytes]]) -> None:
    """Issue 24: ``:scheme`` is ``https`` or ``http`` (it was never checked, only dropped), and
    no pseudo-header carries a control character (RFC 9113 §8.2.1)."""
    with pytest.raises(H2RequestError) as err:
        head(fields=fields)
    assert err.value.status == 400
    assert "malformed request" in str(err.value)


def test_scheme_http_and_https_are_well_formed() -> None:
    for scheme in (b"https", b"http"):
        assert head(fields=_with(b":scheme", scheme)).target == b"/c1/api/v1/pods?watch=1"


def test_te_trailers_and_inner_whitespace_are_well_formed() -> None:
    h = head([(b"te", b"trailers"), (b"x-a", b"a b\tc"), (b"x-empty", b"")])
    assert h.get(b"te") == b"trailers" and h.get(b"x-a") == b"a b\tc" and h.get(b"x-empty") == b""


def test_host_without_authority() -> None:
    fields = [f for f in BASE if f[0] != b":authority"] + [(b"host", b"h.example")]
    assert head(fields=fields).host == b"h.example"


def test_cookies_are_joined() -> None:
    h = head([(b"cookie", b"a=1"), (b"cookie", b"b=2")])
    assert h.get_all(b"cookie") == [b"a=1; b=2"]


def test_body_without_length_goes_chunked() -> None:
    post = [(b":method", b"POST"), *BASE[1:]]
    h = head(fields=post, end_stream=False)
    assert h.chunked and h.get(b"transfer-encoding") == b"chunked"
    h = head([(b"content-length", b"12")], fields=post, end_stream=False)
    assert h.content_length == 12 and not h.chunked
    assert chunk(b"abc") == b"3\r\nabc\r\n" and chunk(b"") == b""


@pytest.mark.parametrize("extra,status", [
    ([(b"content-length", b"1x")], 400),
    ([(b"content-length", b"1"), (b"content-length", b"1")], 400),
    ([(b"x-a", b"v\x00")], 400),
    ([(b"x-a", b"v\r\nimpersonate-user: admin")], 400),
    ([(b"x-a\r\nimpersonate-user", b"admin")], 400),
    ([(b"x a", b"v")], 400),
    ([(b"expect", b"something")], 417),
    ([(b"host", b"a"), (b"host", b"b")], 400),
    ([(f"x-{i}".encode(), b"v") for i in range(129)], 431),
    ([(b"x-big", b"v" * 70000)], 431),
], ids=["cl-not-digits", "cl-twice", "nul", "crlf-in-value", "crlf-in-name", "space-in-name",
        "expect", "two-hosts", "129-fields", "big-field"])
def test_refusals(extra: list[tuple[bytes, bytes]], status: int) -> None:
    with pytest.raises(H2RequestError) as err:
        head(extra)
    assert err.value.status == status


@pytest.mark.parametrize("path,status", [(b"*", 400), (b"/a b", 400), (b"/\xff", 400),
                                         (b"/" + b"a" * 20000, 414)],
                         ids=["asterisk", "space", "non-ascii", "long"])
def test_bad_paths(path: bytes, status: int) -> None:
    fields = [*BASE[:3], (b":path", path)]
    with pytest.raises(H2RequestError) as err:
        head(fields=fields)
    assert err.value.status == status


def test_bad_authority() -> None:
    for authority in (b"a b", b"a\r\nx", b"user@host", b"a,b"):
        with pytest.raises(H2RequestError):
            head(fields=[*BASE[:2], (b":authority", authority), BASE[3]])


def test_connect_is_refused() -> None:
    with pytest.raises(H2RequestError) as err:
        head(fields=[(b":method", b"CONNECT"), (b":authority", b"x:443")])
    assert err.value.status == 405


_REGULAR = [(b"accept", b"application/json"), (b"authorization", b"Bearer t"),
            (b"user-agent", b"kubectl/v1.36"), (b"cookie", b"a=1"), (b"cookie", b"b=2")]


def _shape(h):  # type: ignore[no-untyped-def]
    return (h.method, h.target, h.headers, h.names, h.content_length, h.chunked)


def test_fields_memo_gives_the_heads_it_would_without() -> None:
    """A connection's memo (its last regular fields, checked) reused across streams whose
    pseudo-headers and framing differ: every head is what the memo-less path builds, and each
    is its own (changing one head's lists never reaches the next)."""
    memo = FieldsMemo()
    post = [(b":method", b"POST"), *BASE[1:]]
    other = [BASE[0], BASE[1], (b":authority", b"other:1"), (b":path", b"/c2/version")]
    no_authority = [BASE[0], BASE[1], BASE[3]]
    cases = [(BASE, _REGULAR, True), (other, _REGULAR, True), (post, _REGULAR, False),
             (no_authority, [*_REGULAR, (b"host", b"h.example")], True),
             (post, [*_REGULAR, (b"content-length", b"3")], False), (BASE, _REGULAR, True)]
    for pseudo, regular, end_stream in cases:
        plain = request_head_from_h2(pseudo + regular, DEFAULT_LIMITS, end_stream=end_stream)
        first = request_head_from_h2(pseudo + regular, DEFAULT_LIMITS, end_stream=end_stream,
                                     memo=memo)
        again = request_head_from_h2(pseudo + regular, DEFAULT_LIMITS, end_stream=end_stream,
                                     memo=memo)
        assert _shape(first) == _shape(again) == _shape(plain)
        first.headers.append((b"x-added", b"1"))
        first.names.append(b"x-added")
        assert _shape(again) == _shape(plain)


@pytest.mark.parametrize("bad", [
    [(b"authorization", b"Bearer t\r\nimpersonate-user: admin")],
    [(b"Authorization", b"Bearer t")],
    [(b"connection", b"keep-alive")],
    [(b"te", b"gzip")],
    [(b"x-a", b" v")],
    [BASE[3]],
    [(b"host", b"a"), (b"host", b"b")],
    [(b"host", b"other")],
    [(b"expect", b"something")],
    [(b"content-length", b"1x")],
    [(b"x-big", b"v" * 70000)],
], ids=["crlf-in-value", "upper-case-name", "connection", "te-gzip", "space-before-value",
        "pseudo-after-regular", "two-hosts", "host-not-authority", "expect", "cl-not-digits",
        "big-field"])
def test_fields_memo_never_keeps_a_refusal(bad: list[tuple[bytes, bytes]]) -> None:
    """After a good request the memo holds its fields; a block that differs from them in any
    field is checked in full, refused as it is without a memo, every time it comes."""
    memo = FieldsMemo()
    good = BASE + _REGULAR
    request_head_from_h2(good, DEFAULT_LIMITS, end_stream=True, memo=memo)
    with pytest.raises(H2RequestError) as plain:
        request_head_from_h2(BASE + _REGULAR + bad, DEFAULT_LIMITS, end_stream=True)
    for _ in range(2):
        with pytest.raises(H2RequestError) as err:
            request_head_from_h2(BASE + _REGULAR + bad, DEFAULT_LIMITS, end_stream=True,
                                 memo=memo)
        assert (err.value.status, str(err.value)) == (plain.value.status, str(plain.value))
    changed = [(n, v + b"\x00" if n == b"user-agent" else v) for n, v in good]
    with pytest.raises(H2RequestError):  # one value differs from the memo's: checked again
        request_head_from_h2(changed, DEFAULT_LIMITS, end_stream=True, memo=memo)
    assert request_head_from_h2(good, DEFAULT_LIMITS, end_stream=True, memo=memo).get(
        b"authorization") == b"Bearer t"


def test_fields_memo_is_per_limits_and_forgets() -> None:
    memo = FieldsMemo()
    fields = [*BASE, (b"x-a", b"v" * 100)]
    request_head_from_h2(fields, DEFAULT_LIMITS, end_stream=True, memo=memo)
    tight = Limits(max_head_bytes=DEFAULT_LIMITS.max_head_bytes, max_field_line=64,
                   max_request_line=DEFAULT_LIMITS.max_request_line,
                   max_headers=DEFAULT_LIMITS.max_headers)
    with pytest.raises(H2RequestError) as err:
        request_head_from_h2(fields, tight, end_stream=True, memo=memo)
    assert err.value.status == 431
    memo.forget()
    assert memo.last is None


def test_response_translated() -> None:
    t = ResponseTranslator(b"GET")
    out = t.feed(b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 200 OK\r\nConnection: keep-alive, x-hop"
                 b"\r\nX-Hop: 1\r\nKeep-Alive: timeout=5\r\nTransfer-Encoding: chunked\r\n"
                 b"Content-Type: application/json\r\nAudit-Id: a\r\n\r\n4\r\n{\"a\"\r\n")
    assert out[0] == ResponseStart(200, [(b":status", b"200"),
                                         (b"content-type", b"application/json"),
                                         (b"audit-id", b"a")])
    assert out[1:] == [b'{"a"']
    assert not t.complete
    # Split anywhere, even inside size lines and CRLFs.
    rest = b"3;x=y\r\n:1}\r\n0\r\nT: v\r\n\r\n"
    payload = b"".join(b for i in range(len(rest)) for b in t.feed(rest[i:i + 1]))
    assert payload == b":1}" and t.complete


def test_response_payload_is_one_piece_per_feed_and_borrowed_only_when_one_chunk() -> None:
    # Every chunk of one read leaves as one piece (a watch's read carries many events: one
    # DATA frame, not one per event); several are joined into owned bytes.
    t = ResponseTranslator(b"GET")
    t.feed(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n")
    buf = bytearray(b"".join(b"2\r\n%02d\r\n" % i for i in range(64)) + b"0\r\n\r\n")
    out = t.feed(memoryview(buf))
    assert t.complete
    assert out == [b"".join(b"%02d" % i for i in range(64))] and type(out[0]) is bytes
    buf[:] = b"x" * len(buf)  # reuse (and resizing) of the input buffer changes nothing
    buf += b"more"
    assert out[0][:2] == b"00" and out[0][-2:] == b"63"
    # One chunk's payload (most of a large body's reads) is a view of the input, not a copy:
    # valid until the caller returns (the front door copies what it keeps).
    t = ResponseTranslator(b"GET")
    t.feed(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n")
    buf = bytearray(b"5\r\nabcde\r\n")
    [piece] = t.feed(memoryview(buf))
    assert isinstance(piece, memoryview) and piece.obj is buf and bytes(piece) == b"abcde"
    buf = bytearray(b"4\r\nfg")  # a read that ends inside a chunk
    [piece] = t.feed(memoryview(buf))
    assert isinstance(piece, memoryview) and piece.obj is buf and bytes(piece) == b"fg"
    assert t.feed(b"hi\r\n") == [b"hi"] and not t.complete
    # A Content-Length body: the input as it is when all of it is body, else a view.
    t = ResponseTranslator(b"GET")
    t.feed(b"HTTP/1.1 200 OK\r\nContent-Length: 4\r\n\r\n")
    buf = bytearray(b"abcd")
    [piece] = t.feed(memoryview(buf))
    assert isinstance(piece, memoryview) and piece.obj is buf and bytes(piece) == b"abcd"


@pytest.mark.parametrize("body", [b"g\r\n", b"2\nab\r\n", b"2\r\nabX", b"0\r\nT\r\n\r\n"])
def test_malformed_chunked_response_is_the_agents_fault(body: bytes) -> None:
    t = ResponseTranslator(b"GET")
    t.feed(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n")
    with pytest.raises(HTTPError) as info:
        t.feed(body)
    assert info.value.status == 502 and not t.complete


def test_response_content_length_and_close_delimited() -> None:
    t = ResponseTranslator(b"GET")
    assert t.feed(b"HTTP/1.1 200 OK\r\nContent-Length: 3\r\n\r\nab")[1:] == [b"ab"]
    assert t.feed(b"c") == [b"c"] and t.complete
    t = ResponseTranslator(b"GET")
    t.feed(b"HTTP/1.1 200 OK\r\n\r\nabc")
    assert not t.complete
    t.feed_eof()
    assert t.complete
    t = ResponseTranslator(b"GET")
    t.feed(b"HTTP/1.1 200 OK\r\nContent-Length: 3\r\n\r\nab")
    with pytest.raises(HTTPError):
        t.feed_eof()
    assert not t.complete


def test_head_and_204_have_no_body() -> None:
    t = ResponseTranslator(b"HEAD")
    out = t.feed(b"HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\n")
    assert out == [ResponseStart(200, [(b":status", b"200"), (b"content-length", b"10")])]
    assert t.complete


_PLAIN_HEADS = [
    b"HTTP/1.1 200 OK\r\nAudit-Id: a-1\r\nContent-Type: application/json\r\n"
    b"Content-Length: 2\r\n\r\n",
    b"HTTP/1.1 404 \r\nContent-Length:0\r\nX-A:  v w \t\r\nKeep-Alive: timeout=5\r\n"
    b"Upgrade: h2c\r\nTE: trailers\r\nProxy-Connection: x\r\nX-Empty:\r\n\r\n",
    b"HTTP/1.1 200\r\nCONTENT-LENGTH: 5\r\nSet-Cookie: a=1\r\nSet-Cookie: b=2\r\n\r\n",
]


@pytest.mark.parametrize("raw", _PLAIN_HEADS, ids=["kube", "dropped-and-ows", "no-reason"])
def test_relayed_fields_are_those_of_the_full_parse(raw: bytes) -> None:
    """A plain response head, read for its framing only by the Exchange, gives the HTTP/2
    fields the full parse gives: names lower-cased, values without surrounding whitespace,
    connection-specific fields dropped."""
    full = parse_response_head(raw)
    framing = relayed_head(raw)
    assert framing is not None and not framing.names
    assert relayed_fields(raw, framing.status) == response_fields(full)


@settings(max_examples=300, deadline=None)
@given(st.lists(st.tuples(st.sampled_from([b"x-a", b"X-B", b"te", b"Keep-Alive", b"upgrade",
                                            b"content-type", b"Audit-Id", b"proxy-connection"]),
                          st.binary(max_size=12).map(lambda v: bytes(
                              b for b in v if b == 9 or (b >= 0x20 and b != 0x7F)))),
                max_size=8),
       st.sampled_from([b"200 OK", b"201", b"404 Not Found", b"500 "]))
def test_relayed_fields_match_the_full_parse_on_any_plain_head(
        fields: list[tuple[bytes, bytes]], status: bytes) -> None:
    raw = (b"HTTP/1.1 " + status + b"\r\n" + b"".join(n + b":" + v + b"\r\n" for n, v in fields)
           + b"Content-Length: 0\r\n\r\n")
    framing = relayed_head(raw)
    assert framing is not None
    assert relayed_fields(raw, framing.status) == response_fields(parse_response_head(raw))


@pytest.mark.parametrize("raw", [*_PLAIN_HEADS, b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n"
                                 b"Connection: x-hop\r\nX-Hop: 1\r\n\r\n",
                                 b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n",
                                 b"HTTP/1.1 200 OK\r\n\r\n"],
                         ids=["kube", "dropped-and-ows", "no-reason", "nominated", "chunked",
                              "no-fields"])
def test_primed_translator_starts_as_the_parsing_one(raw: bytes) -> None:
    """The head the Exchange read (in full, or for its framing only when plain) primes the
    translator: the ResponseStart and the payload are those of a translator that parses the
    bytes itself, whether the head comes whole with its body or byte by byte."""
    body = b"2\r\nok\r\n0\r\n\r\n" if b"chunked" in raw else b"ok"[:int(
        parse_response_head(raw).content_length or 0)]
    parsing = ResponseTranslator(b"GET")
    want = parsing.feed(raw + body)
    for pieces in ([raw + body], [raw[i:i + 1] for i in range(len(raw))] + [body]):
        primed = ResponseTranslator(b"GET")
        primed.expect(relayed_head(raw) or parse_response_head(raw))
        got = [item for piece in pieces for item in primed.feed(piece)]
        assert got == want and primed.complete == parsing.complete


@pytest.mark.parametrize("raw", _PLAIN_HEADS, ids=["kube", "dropped-and-ows", "no-reason"])
def test_whole_response_translates_as_the_parsing_one(raw: bytes) -> None:
    """A whole plain response (the Exchange's relayhead.whole_response) primes the translator
    with its status only: the ResponseStart and the payload are those of a translator that
    parses the bytes itself, the response is complete, and the bytes may come as a view."""
    body = b"okay!"[:int(parse_response_head(raw).content_length or 0)]
    whole = whole_response(raw + body, b"GET")
    assert whole is not None
    want = ResponseTranslator(b"GET").feed(raw + body)
    for data in (raw + body, memoryview(raw + body)):
        translator = ResponseTranslator(b"GET")
        translator.expect_whole(whole[0])
        assert translator.feed(data) == want
        assert translator.complete
        translator.feed_eof()  # the agent's EOF after it ends nothing more
        assert translator.complete
