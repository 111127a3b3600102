"""HTTP/1.1 requests in, HTTP/2 to the apiserver, HTTP/1.1 responses out (sans-IO).

The agent's side of HTTP/2 (``gateway.agent.h2pool``), the reverse of ``gateway.wire.http2``:
a tunnel stream carries one HTTP/1.1 exchange, already rewritten by the agent (its credential
and the impersonation headers are in the head), and the agent sends it to a kube-apiserver that
negotiated ``h2``. Three pure translations, no frames and no sockets (framing, HPACK and flow
control are :mod:`gateway.wire.h2client`'s):

* :func:`request_fields` turns the rewritten :class:`RequestHead` into an HTTP/2 header list:
  ``:method``, ``:scheme`` (https), ``:authority`` (from ``Host``), ``:path``, then the fields
  with lower-cased names minus the connection-specific ones (RFC 9113 §8.2.2: ``Connection``
  and the names it nominates, ``Keep-Alive``, ``Proxy-Connection``, ``Transfer-Encoding``,
  ``Upgrade``, and ``TE`` unless it is ``trailers``). Upgrades never come here (they stay on
  HTTP/1.1 connections); a request that asks for one is a caller bug (ValueError).
* :class:`RequestBody` yields the payload of the request body from its HTTP/1.1 framing
  (``Content-Length`` bytes as they are; ``chunked`` de-chunked by the one de-chunker,
  :class:`gateway.wire.http1.ChunkedBody`), and says when it has ended.
* :func:`response_head` turns the response's HEADERS block into an HTTP/1.1 response head,
  checking it itself (the client core checks frames and stream states, not fields): the block
  must be well-formed HTTP/2 (RFC 9113 §8.3.2 and §8.2) and every byte of it must be safe in
  an HTTP/1.1 head. Without a ``Content-Length`` (a watch, ``logs -f``, a large list) the body
  is sent chunked: one chunk for the DATA of a stream that one read brought
  (``gateway.agent.h2pool``), :data:`gateway.wire.http2.LAST_CHUNK` at the end of the stream.
  Responses that have no body (HEAD, 1xx, 204, 304) are never chunked.
"""

from __future__ import annotations

from http import HTTPStatus

from gateway.wire.http1 import (
    NO_BODY,
    ChunkedBody,
    ContentLengthBody,
    HTTPError,
    NoBody,
    RequestHead,
    ResponseHead,
    plain_content_length,
    serialize_response_fields,
)
from gateway.wire.http2 import CONNECTION_SPECIFIC, LOWER_TCHAR

Headers = list[tuple[bytes, bytes]]

_DIGITS = b"0123456789"
_REASONS = {int(s): s.phrase.encode("ascii") for s in HTTPStatus}
# RFC 9110 tchar without upper-case letters: HTTP/2 field names are lower case (RFC 9113 §8.2.1).


def request_fields(head: RequestHead, scheme: bytes = b"https") -> Headers:
    """The HTTP/2 header list of an HTTP/1.1 request head (see the module docstring)."""
    if head.upgrade is not None or head.method == b"CONNECT":
        raise ValueError("upgrades and CONNECT stay on HTTP/1.1")
    authority = head.host
    if not authority:
        raise ValueError("a request needs a Host")
    out: Headers = [(b":method", head.method), (b":scheme", scheme),
                    (b":authority", authority), (b":path", head.target)]
    nominated = head.connection
    for (_name, value), lname in zip(head.headers, head.names, strict=True):
        if lname == b"host" or lname in nominated:
            continue
        if lname in CONNECTION_SPECIFIC:
            if lname == b"te" and value.strip().lower() == b"trailers":
                out.append((b"te", b"trailers"))
            continue
        out.append((lname, value))
    return out



class RequestBody:
    """Payload of an HTTP/1.1 request body, from its framing.

    A chunked body is de-chunked by :class:`gateway.wire.http1.ChunkedBody`, with the same
    rules and limits as the exchange's own tracker (which already checked these bytes, so
    nothing it let through is refused here; what it would refuse raises :class:`HTTPError` 400).
    """

    __slots__ = ("_chunks", "_tracker", "chunked")

    def __init__(self, head: RequestHead) -> None:
        self.chunked = head.chunked
        self._chunks = ChunkedBody(error_status=400) if head.chunked else None
        self._tracker: ChunkedBody | ContentLengthBody | NoBody
        if self._chunks is not None:
            self._tracker = self._chunks
        elif head.content_length:
            self._tracker = ContentLengthBody(head.content_length)
        else:
            self._tracker = NO_BODY

    @property
    def complete(self) -> bool:
        return self._tracker.complete

    def feed(self, data: bytes | bytearray | memoryview) -> list[memoryview]:
        """The payload in ``data`` (possibly several pieces); bytes past the end are ignored.

        The pieces are views of ``data`` (no copy): use or copy them before ``data`` changes.
        """
        chunks = self._chunks
        if chunks is not None:
            pieces: list[memoryview] = []
            chunks.feed(data, payload=pieces)
            return pieces
        n = self._tracker.feed(data)
        return [memoryview(data)[:n]] if n else []


_NO_BODY = RequestBody(RequestHead(b"GET", b"/", b"HTTP/1.1", [], []))


def request_body(head: RequestHead) -> RequestBody:
    """The :class:`RequestBody` of ``head``: one shared, stateless one for a request without a
    body (most requests), a new one otherwise."""
    if head.chunked or head.content_length:
        return RequestBody(head)
    return _NO_BODY


def response_head(fields: Headers, request_method: bytes) -> tuple[bytes, bool]:
    """(HTTP/1.1 response head, whether its body must be sent chunked) for a HEADERS block:
    :func:`relayed_response`'s bytes and framing."""
    head_bytes, head = relayed_response(fields, request_method)
    return head_bytes, head.chunked


def relayed_response(fields: Headers, request_method: bytes,
                     declared_length: int | None = None) -> tuple[bytes, ResponseHead]:
    """The HTTP/1.1 response head for a HEADERS block, as bytes and parsed (what
    ``gateway.wire.http1.parse_response_head`` would make of those bytes, its fields left
    out: ``chunked`` when the body must be sent chunked, ``content_length`` when the block
    declares one). ``declared_length``: the block's first ``content-length`` as the client
    core already parsed it (``gateway.wire.h2client.ResponseReceived.content_length``, -1:
    it does not parse), so that it is not parsed twice; None: parse it here.

    ``fields`` as the client core decodes them, unchecked: raises ``HTTPError`` (502) unless
    ``:status`` comes first, once, as three digits, with no other pseudo-header; names are
    lower-case tokens (RFC 9113 §8.2.1); no connection-specific field (§8.2.2); at most one
    ``content-length``, plain digits; no value holds a control character (CR, LF and NUL could
    split the HTTP/1.1 head this becomes). Surrounding whitespace in a value is left to the
    HTTP/1.1 parser, which strips it as optional whitespace.
    """
    status_value: bytes | None = None
    names: list[bytes] = []
    values: list[bytes] = []
    length: bytes | None = None
    for name, value in fields:
        if name[:1] == b":":
            if name != b":status" or status_value is not None or names:
                raise HTTPError("upstream sent a misplaced or unknown pseudo-header", 502)
            status_value = value
            continue
        if name in CONNECTION_SPECIFIC:
            raise HTTPError("upstream sent a connection-specific field over HTTP/2", 502)
        if name == b"content-length":
            if length is not None:
                raise HTTPError("upstream sent more than one content-length", 502)
            length = value
        names.append(name)
        values.append(value)
    if status_value is None or len(status_value) != 3 or status_value.translate(None, _DIGITS) \
            or status_value[:1] == b"0":
        raise HTTPError("upstream sent a malformed :status", 502)
    if not all(names) or b"".join(names).translate(None, LOWER_TCHAR):
        raise HTTPError("upstream sent a field name that is not a lower-case token", 502)
    content_length = None
    if length is not None:
        if declared_length is None:
            content_length = plain_content_length(length.strip(b" \t"))
        elif declared_length >= 0:
            content_length = declared_length
        if content_length is None:
            raise HTTPError("upstream sent an invalid content-length", 502)
    status = int(status_value)
    bodiless = status < 200 or status in (204, 304) or request_method == b"HEAD"
    chunked = not bodiless and length is None
    if chunked:
        names.append(b"transfer-encoding")
        values.append(b"chunked")
    reason = _REASONS.get(status, b"Unknown")
    try:  # checks every value for control characters (the names are checked above)
        head_bytes = serialize_response_fields(status, reason, names, values)
    except ValueError:
        raise HTTPError("upstream sent a header HTTP/1.1 cannot carry", 502) from None
    return head_bytes, ResponseHead(b"HTTP/1.1", status, reason, [], [], content_length, chunked)
