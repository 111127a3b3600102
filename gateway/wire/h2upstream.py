"""HTTP/1.1 requests in, HTTP/2 to the apiserver, HTTP/1.1 responses out (sans-IO).

The agent's side of HTTP/2 (``gateway.agent.h2pool``), the reverse of ``gateway.wire.http2``:
a tunnel stream carries one HTTP/1.1 exchange, already rewritten by the agent (its credential
and the impersonation headers are in the head), and the agent sends it to a kube-apiserver that
negotiated ``h2``. Three pure translations, no frames and no sockets (framing, HPACK and flow
control are the ``h2`` library's):

* :func:`request_fields` turns the rewritten :class:`RequestHead` into an HTTP/2 header list:
  ``:method``, ``:scheme`` (https), ``:authority`` (from ``Host``), ``:path``, then the fields
  with lower-cased names minus the connection-specific ones (RFC 9113 §8.2.2: ``Connection``
  and the names it nominates, ``Keep-Alive``, ``Proxy-Connection``, ``Transfer-Encoding``,
  ``Upgrade``, and ``TE`` unless it is ``trailers``). Upgrades never come here (they stay on
  HTTP/1.1 connections); a request that asks for one is a caller bug (ValueError).
* :class:`RequestBody` yields the payload of the request body from its HTTP/1.1 framing
  (``Content-Length`` bytes as they are; ``chunked`` de-chunked), and says when it has ended.
  The exchange has already validated the framing byte for byte; this only strips it.
* :func:`response_head` turns the response's HEADERS block into an HTTP/1.1 response head,
  checking it itself (``h2``'s own inbound validation is off: it cost more than the rest of
  the response path): the block must be well-formed HTTP/2 (RFC 9113 §8.3.2 and §8.2) and
  every byte of it must be safe in an HTTP/1.1 head. Without a ``Content-Length`` (a watch,
  ``logs -f``, a large list) the body is sent chunked: :func:`gateway.wire.http2.chunk` per
  DATA frame, :data:`gateway.wire.http2.LAST_CHUNK` at the end of the stream. Responses that
  have no body (HEAD, 1xx, 204, 304) are never chunked.
"""

from __future__ import annotations

from http import HTTPStatus

from gateway.wire.http1 import HTTPError, RequestHead, serialize_response_head
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



# RequestBody states
_SIZE, _DATA, _CRLF, _TRAILER, _DONE = range(5)


class RequestBody:
    """Payload bytes of an HTTP/1.1 request body, from its framing (already validated)."""

    __slots__ = ("_line", "_remaining", "_state", "chunked")

    def __init__(self, head: RequestHead) -> None:
        self.chunked = head.chunked
        self._line = bytearray()
        if head.chunked:
            self._state, self._remaining = _SIZE, 0
        elif head.content_length:
            self._state, self._remaining = _DATA, head.content_length
        else:
            self._state, self._remaining = _DONE, 0

    @property
    def complete(self) -> bool:
        return self._state == _DONE

    def feed(self, data: bytes | bytearray | memoryview) -> list[bytes]:
        """The payload in ``data`` (possibly several pieces); bytes past the end are ignored."""
        out: list[bytes] = []
        view = memoryview(data)
        pos, n = 0, len(view)
        while pos < n and self._state != _DONE:
            state = self._state
            if state == _DATA:
                take = min(n - pos, self._remaining)
                out.append(bytes(view[pos:pos + take]))
                pos += take
                self._remaining -= take
                if not self._remaining:
                    self._state = _CRLF if self.chunked else _DONE
                continue
            # a size line, the CRLF after chunk data, or a trailer line: each ends at LF
            i = bytes(view[pos:]).find(b"\n")
            if i < 0:
                self._line += view[pos:]
                if len(self._line) > 64 * 1024:
                    raise HTTPError("chunk line too long", 400)
                break
            line = bytes(self._line) + bytes(view[pos:pos + i])
            self._line.clear()
            pos += i + 1
            if state == _CRLF:
                self._state = _SIZE
            elif state == _SIZE:
                size = int(line.rstrip(b"\r").partition(b";")[0].strip(b" \t") or b"0", 16)
                self._state, self._remaining = (_DATA, size) if size else (_TRAILER, 0)
            elif line.rstrip(b"\r") == b"":  # the blank line that ends the trailer section
                self._state = _DONE
        return out


def response_head(fields: Headers, request_method: bytes) -> tuple[bytes, bool]:
    """(HTTP/1.1 response head, whether its body must be sent chunked) for a HEADERS block.

    ``fields`` as ``h2`` decodes them, unchecked (its inbound validation is off): raises
    ``HTTPError`` (502) unless ``:status`` comes first, once, as three digits, with no other
    pseudo-header; names are lower-case tokens (RFC 9113 §8.2.1); no connection-specific field
    (§8.2.2); no value holds a control character (CR, LF and NUL could split the HTTP/1.1 head
    this becomes). Surrounding whitespace in a value is left to the HTTP/1.1 parser, which
    strips it as optional whitespace.
    """
    status_value: bytes | None = None
    headers: Headers = []
    has_length = False
    for name, value in fields:
        if name[:1] == b":":
            if name != b":status" or status_value is not None or headers:
                raise HTTPError("upstream sent a misplaced or unknown pseudo-header", 502)
            status_value = value
            continue
        if name in CONNECTION_SPECIFIC:
            raise HTTPError("upstream sent a connection-specific field over HTTP/2", 502)
        if name == b"content-length":
            has_length = True
        headers.append((name, value))
    if status_value is None or len(status_value) != 3 or status_value.translate(None, _DIGITS) \
            or status_value[:1] == b"0":
        raise HTTPError("upstream sent a malformed :status", 502)
    names = [name for name, _ in headers]
    if not all(names) or b"".join(names).translate(None, LOWER_TCHAR):
        raise HTTPError("upstream sent a field name that is not a lower-case token", 502)
    status = int(status_value)
    bodiless = status < 200 or status in (204, 304) or request_method == b"HEAD"
    chunked = not bodiless and not has_length
    if chunked:
        headers.append((b"transfer-encoding", b"chunked"))
    try:  # checks every value for control characters (and the names again, as tokens)
        head = serialize_response_head(status, _REASONS.get(status, b"Unknown"), headers)
    except ValueError:
        raise HTTPError("upstream sent a header HTTP/1.1 cannot carry", 502) from None
    return head, chunked
