"""HTTP/2 requests in, HTTP/1.1 over the tunnel, HTTP/2 responses out (sans-IO).

The front door speaks HTTP/2 to clients (``gateway.hub.frontdoor_h2``) but every tunnel stream
still carries one HTTP/1.1 exchange, so the agent and the admission chain stay as they are. This
module holds the two pure translations, no frames and no sockets (framing, HPACK and flow
control are the ``h2`` library's):

* :func:`request_head_from_h2` turns a decoded HEADERS block into the same
  :class:`gateway.wire.http1.RequestHead` an HTTP/1.1 request produces, so the admission rules
  (``gateway.hub.admission.chain.prepare``) exist once. It also enforces RFC 9113 §8.2-8.3 in
  the same single pass (the ``h2`` library's own inbound validation, a chain of generators, cost
  the front door a fifth of its CPU per request, so it is turned off there): names are
  lower-case tokens, values hold no control characters and no surrounding whitespace, no
  connection-specific fields, ``te`` only ``trailers``, pseudo-headers only ``:method``,
  ``:scheme``, ``:authority`` and ``:path``, each at most once and before every regular field,
  ``:method``, ``:scheme`` and a non-empty ``:path`` present, ``Host`` equal to ``:authority``
  when both are sent, ``:scheme`` ``https`` or ``http``, no control character in any
  pseudo-header (§8.2.1). A request that breaks them is malformed (RFC 9113 §8.1.1): it is
  answered 400 on its stream and never forwarded; the connection carries on. On top of that
  the head meets our HTTP/1.1 limits (field count, line and head sizes: 431/414) and the same
  byte rules (method a token, target visible ASCII, ``Content-Length`` plain digits). A body
  without ``Content-Length`` is forwarded chunked (:func:`chunk`). ``CONNECT`` (and so extended
  CONNECT, RFC 8441) is refused with 405: WebSocket and SPDY upgrades stay on HTTP/1.1, as
  client-go does. Clients resend the same regular fields on every stream: a connection's
  :class:`FieldsMemo` keeps its last checked ones, so only the pseudo-headers are checked
  again when they repeat.
* :class:`ResponseTranslator` takes the HTTP/1.1 response bytes the
  :class:`gateway.hub.exchange.Exchange` relays (already checked by it: head parsed strictly,
  body framing validated) and yields one :class:`ResponseStart` (``:status`` plus the fields
  minus connection-specific ones, names lower-cased) and the body payload de-chunked, with
  ``complete`` set once the body's framing says it has ended. Interim 1xx heads are dropped.
"""

from __future__ import annotations

from dataclasses import dataclass

from mypy_extensions import mypyc_attr

from gateway.wire.http1 import (
    NO_BODY,
    BodyTracker,
    ChunkedBody,
    Limits,
    RequestHead,
    ResponseHead,
    find_head_end,
    framing_for_response,
    parse_response_head,
    plain_content_length,
)

Headers = list[tuple[bytes, bytes]]

_TCHAR = b"!#$%&'*+-.^_`|~0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz"
LOWER_TCHAR = b"!#$%&'*+-.^_`|~0123456789abcdefghijklmnopqrstuvwxyz"  # HTTP/2 field names
_TARGET_OK = bytes(range(0x21, 0x7F))
_HOST_OK = _TARGET_OK.translate(None, b",/@")  # visible ASCII but a list, a path, userinfo
_VALUE_OK = bytes(b for b in range(256) if b == 9 or (b >= 0x20 and b != 0x7F))

# RFC 9113 §8.2.2: never in HTTP/2 (h2 refuses them inbound; we drop them outbound), plus the
# names a response's Connection header nominates.
CONNECTION_SPECIFIC = frozenset(
    (b"connection", b"keep-alive", b"proxy-connection", b"transfer-encoding", b"upgrade", b"te")
)
# Never in an HTTP/2 request (RFC 9113 §8.2.2); ``te`` is allowed as ``trailers`` only.
_CONNECTION_SPECIFIC_IN = CONNECTION_SPECIFIC - {b"te"}
_SPACE = (0x20, 0x09)
_NOTABLE = _CONNECTION_SPECIFIC_IN | {b"te", b"cookie", b"content-length"}
# The request pseudo-headers (RFC 9113 §8.3.1) as bits of a seen-set, and a bit for "a regular
# field came". ``:protocol`` (extended CONNECT, RFC 8441) is not among them:
# SETTINGS_ENABLE_CONNECT_PROTOCOL is never offered.
_METHOD, _SCHEME, _AUTHORITY, _PATH, _REGULAR = 1, 2, 4, 8, 16
_PSEUDO = {b":method": _METHOD, b":scheme": _SCHEME, b":authority": _AUTHORITY, b":path": _PATH}
_REQUIRED = _METHOD | _SCHEME | _PATH
_SCHEMES = frozenset((b"https", b"http"))


@mypyc_attr(native_class=False)
class H2RequestError(ValueError):
    """A request refused before admission; ``status`` is what the stream is answered with."""

    def __init__(self, message: str, status: int = 400) -> None:
        super().__init__(message)
        self.status = status


class CheckedFields:
    """The regular fields of one HEADERS block (everything after its pseudo-headers), checked
    against RFC 9113 §8.2 and our limits, with what the head is built from. Immutable once
    made: every head built from it copies its lists."""

    __slots__ = ("count", "expect_ok", "headers", "host", "hosts", "lengths", "limits", "names",
                 "received", "size")

    def __init__(self, received: Headers, limits: Limits) -> None:
        self.received = received  # the fields as decoded (compared, never changed)
        self.limits = limits
        headers: Headers = []
        names: list[bytes] = []
        cookies: list[bytes] = []
        lengths: list[bytes] = []
        size = 0
        max_line = limits.max_field_line
        for name, value in received:
            size += len(name) + len(value) + 4  # as the HTTP/1.1 line "name: value\r\n" would be
            if name[:1] == b":":  # the pseudo-headers come first: this one is misplaced
                raise H2RequestError("malformed request: unknown, repeated or misplaced "
                                     "pseudo-header field")
            if len(name) + len(value) + 2 > max_line:
                raise H2RequestError("header field too large", 431)
            if not name or name.translate(None, LOWER_TCHAR):
                # Never a CRLF into HTTP/1.1; upper case is malformed in HTTP/2 (RFC 9113 §8.2).
                raise H2RequestError("invalid header name: HTTP/2 field names are lower-case "
                                     "tokens")
            if value.translate(None, _VALUE_OK):
                raise H2RequestError("control character in a header value")
            if value and (value[0] in _SPACE or value[-1] in _SPACE):
                raise H2RequestError("malformed request: whitespace around a header value")
            if name in _NOTABLE:  # one set lookup for the common field, the rest only for these
                if name in _CONNECTION_SPECIFIC_IN:
                    raise H2RequestError("malformed request: connection-specific header field")
                if name == b"te" and value.lower() != b"trailers":
                    raise H2RequestError("malformed request: te other than trailers")
                if name == b"cookie":
                    cookies.append(value)  # RFC 9113 §8.2.3: crumbs are joined for HTTP/1.1
                    continue
                if name == b"content-length":
                    lengths.append(value)
            headers.append((name, value))
            names.append(name)
        self.size = size
        self.count = len(headers)  # the fields an HTTP/1.1 head would count (cookies joined)
        if cookies:
            headers.append((b"cookie", b"; ".join(cookies)))
            names.append(b"cookie")
        self.headers = headers
        self.names = names
        self.lengths = lengths
        self.hosts = names.count(b"host")
        self.host = headers[names.index(b"host")][1] if self.hosts else b""
        expect = headers[names.index(b"expect")][1] if b"expect" in names else None
        self.expect_ok = expect is None or expect.lower() == b"100-continue"


class FieldsMemo:
    """A client connection's last checked regular fields (:class:`CheckedFields`): clients
    resend the same fields on every stream (token, user agent, accept types; only the
    pseudo-headers change), so a block whose regular fields equal the last one's is a list
    comparison, not every field checked and copied again. Per connection only (it holds the
    request's token as the HPACK table does, never beyond the connection); only a list that
    passed is kept; :meth:`forget` drops it when the connection may stay open for hours."""

    __slots__ = ("last",)

    def __init__(self) -> None:
        self.last: CheckedFields | None = None

    def checked(self, received: Headers, limits: Limits) -> CheckedFields:
        last = self.last
        if last is not None and last.limits is limits and last.received == received:
            return last
        self.last = last = CheckedFields(received, limits)
        return last

    def forget(self) -> None:
        self.last = None


def request_head_from_h2(fields: Headers, limits: Limits, *, end_stream: bool,
                         memo: FieldsMemo | None = None) -> RequestHead:
    """The protocol-neutral head of one HTTP/2 request (see the module docstring).

    ``fields`` is the decoded HEADERS block as ``h2`` delivers it: bytes, in order, unchecked.
    ``end_stream``: the HEADERS frame ended the stream (no body follows). ``memo``: the
    connection's, to skip checking regular fields equal to its last request's.
    """
    if len(fields) > limits.max_headers + 4:
        raise H2RequestError("too many header fields", 431)
    method = path = authority = b""
    seen = 0
    size = 0
    regular_at = len(fields)
    for i, (name, value) in enumerate(fields):
        if name[:1] != b":":
            regular_at = i
            break
        size += len(name) + len(value) + 4  # sized as the request line (414) below
        bit = _PSEUDO.get(name)
        if bit is None or seen & bit:
            raise H2RequestError("malformed request: unknown, repeated or misplaced "
                                 "pseudo-header field")
        seen |= bit
        if value.translate(None, _VALUE_OK):  # RFC 9113 §8.2.1, pseudo-headers too
            raise H2RequestError("malformed request: control character in a "
                                 "pseudo-header field")
        if bit == _METHOD:
            method = value
        elif bit == _PATH:
            path = value
        elif bit == _AUTHORITY:
            authority = value
        elif value not in _SCHEMES:  # checked, then dropped: HTTP/1.1 does not carry it
            raise H2RequestError("malformed request: :scheme is neither https nor http")
    regular = fields[regular_at:]  # a copy: the memo compares it with the next block's
    checked = memo.checked(regular, limits) if memo is not None \
        else CheckedFields(regular, limits)
    if size + checked.size > limits.max_head_bytes:
        raise H2RequestError("request header fields too large", 431)
    if checked.count > limits.max_headers:
        raise H2RequestError("too many header fields", 431)
    if method == b"CONNECT":
        raise H2RequestError("CONNECT is not supported; upgrades use HTTP/1.1", 405)
    if seen & _REQUIRED != _REQUIRED:
        raise H2RequestError("malformed request: :method, :scheme and :path are required")
    if not method or method.translate(None, _TCHAR):
        raise H2RequestError("invalid method", 400)
    if len(method) + len(path) + 10 > limits.max_request_line:
        raise H2RequestError("request target too long", 414)
    if not path or path.translate(None, _TARGET_OK) or path[:1] != b"/":
        raise H2RequestError("invalid request target", 400)
    hosts = checked.hosts
    if hosts > 1:
        raise H2RequestError("more than one Host header", 400)
    headers = checked.headers.copy()  # the head's own lists: a door or admission may change them
    names = checked.names.copy()
    if authority:
        if hosts:  # RFC 9113 §8.3.1: the same authority twice, or malformed; one Host travels
            if checked.host != authority:
                raise H2RequestError("malformed request: Host differs from :authority")
            i = names.index(b"host")
            del headers[i], names[i]
        headers.insert(0, (b"host", authority))
        names.insert(0, b"host")
        host = authority
    elif not hosts:
        raise H2RequestError("a request needs :authority or Host", 400)
    else:
        host = checked.host
    if not host or host.translate(None, _HOST_OK):
        raise H2RequestError("invalid Host header", 400)
    head = RequestHead(method, path, b"HTTP/1.1", headers, names)
    lengths = checked.lengths
    if lengths:
        length = plain_content_length(lengths[0]) if len(lengths) == 1 else None
        if length is None:
            raise H2RequestError("invalid Content-Length", 400)
        head.content_length = length
    elif not end_stream:
        # A body of unknown length: HTTP/1.1 needs it chunked (transfer-encoding was refused).
        head.chunked = True
        headers.append((b"transfer-encoding", b"chunked"))
        names.append(b"transfer-encoding")
    if not checked.expect_ok:
        raise H2RequestError("unsupported Expect", 417)
    return head


def chunk(data: bytes | bytearray | memoryview) -> bytes:
    """One HTTP/1.1 chunk (empty data makes no chunk: the last-chunk is :data:`LAST_CHUNK`)."""
    if not data:
        return b""
    return b"%x\r\n" % len(data) + bytes(data) + b"\r\n"


LAST_CHUNK = b"0\r\n\r\n"


def response_fields(head: ResponseHead) -> Headers:
    """``:status`` and the fields of an HTTP/1.1 response head as HTTP/2 allows them."""
    nominated = head.connection
    out: Headers = [(b":status", b"%d" % head.status)]
    for (_name, value), lname in zip(head.headers, head.names, strict=True):
        if lname in CONNECTION_SPECIFIC or lname in nominated:
            continue
        out.append((lname, value))
    return out


def relayed_fields(raw: bytes, status: int) -> Headers:
    """``:status`` and the fields of a response head that met the rules of
    :func:`gateway.hub.relayhead.relayed_head` (an HTTP/1.1 status line, then ``token:value``
    lines whose values hold no control character but HTAB, none of them ``Connection`` or
    ``Transfer-Encoding``), as HTTP/2 allows them: the same list :func:`response_fields` makes
    from the full parse of those bytes, without that parse."""
    out: Headers = [(b":status", b"%d" % status)]
    lines = raw[raw.index(b"\r\n") + 2:-4]  # between the status line and the empty line
    for line in lines.split(b"\r\n") if lines else ():
        name, _, value = line.partition(b":")
        name = name.lower()
        if name not in CONNECTION_SPECIFIC:
            out.append((name, value.strip(b" \t")))
    return out


@dataclass(slots=True)
class ResponseStart:
    status: int
    fields: Headers


# Translator states (_WHOLE: the next bytes are one whole plain response, see expect_whole)
_HEAD, _BODY, _DONE, _WHOLE = range(4)
_HEAD_END = b"\r\n\r\n"
_RESPONSE_LIMITS = Limits(256 * 1024, 64 * 1024, 64 * 1024, 512)


class ResponseTranslator:
    """HTTP/1.1 response bytes -> one :class:`ResponseStart`, then payload bytes.

    ``feed`` returns what to send, in order: a :class:`ResponseStart` and/or pieces of
    payload. The input is what the Exchange relays, so framing errors here are the agent's
    (raised as :class:`HTTPError` 502). ``complete`` is set when the body has ended by its own
    framing; a close-delimited body completes at :meth:`feed_eof`. A chunked body is checked
    and de-chunked in one pass by its tracker (:class:`gateway.wire.http1.ChunkedBody`).

    A payload piece may be a view of the bytes fed, **valid only until feed's caller returns**
    (the buffer it came in, a tunnel read, is then reused): a caller that keeps a piece longer
    (the front door, for the client's flow-control windows) copies it then. Most of a large
    body leaves at once, so only what a window holds back is copied, not every byte.
    """

    __slots__ = (
        "_buf",
        "_chunks",
        "_primed",
        "_state",
        "complete",
        "method",
        "tracker",
    )

    def __init__(self, method: bytes) -> None:
        self.method = method
        self._state = _HEAD
        self._buf = bytearray()
        self.tracker: BodyTracker = NO_BODY
        self._chunks: ChunkedBody | None = None  # the tracker, when it is the de-chunker
        self.complete = False
        self._primed: tuple[int, Headers | None, BodyTracker] | None = None

    def expect(self, head: ResponseHead) -> None:
        """The next head in the bytes is ``head``, already parsed (and checked) by the
        Exchange: skip it instead of parsing it again (a small GET's response head was
        parsed twice per request). A head without fields is a plain one the Exchange read for
        its framing only (``gateway.hub.relayhead``, whose rules it has met): its fields are
        taken from its bytes as they pass (:func:`relayed_fields`)."""
        fields = response_fields(head) if head.names else None
        self._primed = (head.status, fields, framing_for_response(head, self.method))

    def expect_whole(self, status: int) -> None:
        """The next bytes fed are exactly one whole plain response with ``status``, as the
        Exchange found it (``gateway.hub.relayhead.whole_response``: a head meeting the rules
        of :func:`relayed_fields`, then exactly its ``Content-Length`` body, for a request
        whose answer has one): the fields are taken from the head's bytes and the rest is the
        whole payload, without a head object, a framing or a body tracker (the common small
        answer, one pass)."""
        self._primed = (status, None, NO_BODY)
        self._state = _WHOLE

    def _whole(self, data: bytes | bytearray | memoryview
               ) -> list[ResponseStart | bytes | memoryview]:
        if not isinstance(data, bytes):
            data = bytes(data)
        primed = self._primed
        assert primed is not None
        status = primed[0]
        self._primed = None
        self._state, self.complete = _DONE, True
        end = data.index(_HEAD_END) + 4
        start = ResponseStart(status, relayed_fields(data[:end], status))
        return [start, data[end:]] if len(data) > end else [start]

    def feed(self, data: bytes | bytearray | memoryview
             ) -> list[ResponseStart | bytes | memoryview]:
        if self._state == _WHOLE:
            return self._whole(data)
        out: list[ResponseStart | bytes | memoryview] = []
        if self._state == _HEAD:
            buf = self._buf
            if buf:  # a head that came in pieces
                buf += data
                data = bytes(buf)
                del buf[:]
            elif not isinstance(data, bytes):
                data = bytes(data)
            while self._state == _HEAD:
                end = find_head_end(data, max_head_bytes=256 * 1024,
                                    max_request_line=64 * 1024)
                if end < 0:
                    buf += data
                    return out
                primed = self._primed
                if primed is not None:
                    self._primed = None
                    status, fields, self.tracker = primed
                    start = ResponseStart(status, fields if fields is not None
                                          else relayed_fields(data[:end], status))
                else:
                    head = parse_response_head(data[:end], _RESPONSE_LIMITS)
                    if head.is_interim or head.is_switching:
                        data = data[end:]
                        continue  # 1xx: HTTP/2 clients do without them here; 101 never comes
                    self.tracker = framing_for_response(head, self.method)
                    # The head goes out with the ResponseStart and is not kept: a watch keeps
                    # its translator for hours.
                    start = ResponseStart(head.status, response_fields(head))
                data = data[end:]
                out.append(start)
                self._state = _BODY
                tracker = self.tracker
                self._chunks = tracker if isinstance(tracker, ChunkedBody) else None
                if tracker is NO_BODY:
                    self._state, self.complete = _DONE, True
        if self._state != _BODY or not data:
            return out
        tracker = self.tracker
        chunks = self._chunks
        if chunks is not None:
            # The payload of every chunk in ``data`` as one piece: the client gets it in as few
            # DATA frames as its windows allow, not one frame (and one trip through the
            # flow-control accounting) per chunk; a watch's read often carries many events.
            # Chunk boundaries mean nothing in HTTP/2 (RFC 9113 §8.1).
            # One chunk (a large body's read is mostly one) leaves as the view it is.
            pieces: list[memoryview] = []
            chunks.feed(data, payload=pieces)
            if len(pieces) == 1:
                out.append(pieces[0])
            elif pieces:
                out.append(b"".join(pieces))
        else:
            n = tracker.feed(data)
            if n == len(data) and isinstance(data, bytes):
                out.append(data)
            elif n:
                out.append(memoryview(data)[:n])
        if tracker.complete:
            self._state, self.complete = _DONE, True
        return out

    def feed_eof(self) -> None:
        if self._state == _BODY:
            self.tracker.feed_eof()  # raises unless close-delimited
            self._state, self.complete = _DONE, True
