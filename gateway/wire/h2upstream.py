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
* :class:`FieldEncoder` is the HPACK encoder the connection uses instead of ``hpack``'s: no
  dynamic table and no Huffman coding, so the encoding of a field depends on the field alone
  and is computed once (see the class for why and what is never indexed).
* :func:`response_head` turns the response's HEADERS block into an HTTP/1.1 response head,
  checking it itself (``h2``'s own inbound validation is off: it cost more than the rest of
  the response path): the block must be well-formed HTTP/2 (RFC 9113 §8.3.2 and §8.2) and
  every byte of it must be safe in an HTTP/1.1 head. Without a ``Content-Length`` (a watch,
  ``logs -f``, a large list) the body is sent chunked: :func:`gateway.wire.http2.chunk` per
  DATA frame, :data:`gateway.wire.http2.LAST_CHUNK` at the end of the stream. Responses that
  have no body (HEAD, 1xx, 204, 304) are never chunked.
"""

from __future__ import annotations

from collections.abc import Iterable
from http import HTTPStatus
from typing import ClassVar

from hpack.hpack import encode_integer
from hpack.table import HeaderTable

from gateway.wire.http1 import HTTPError, RequestHead, serialize_response_head
from gateway.wire.http2 import CONNECTION_SPECIFIC

Headers = list[tuple[bytes, bytes]]

_DIGITS = b"0123456789"
_REASONS = {int(s): s.phrase.encode("ascii") for s in HTTPStatus}
# RFC 9110 tchar without upper-case letters: HTTP/2 field names are lower case (RFC 9113 §8.2.1).
_LOWER_TCHAR = b"!#$%&'*+-.^_`|~0123456789abcdefghijklmnopqrstuvwxyz"


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



# Fields sent "never indexed" (RFC 7541 §7.1.3: no intermediary may put them in a compression
# context): credentials, as h2's own encoder did for authorization and proxy-authorization, and
# the impersonation headers that name the hub user. The first set is also never cached here.
_SECRET_FIELDS = frozenset((b"authorization", b"proxy-authorization", b"cookie"))
_NEVER_INDEXED_PREFIX = b"impersonate-"
_STATIC = HeaderTable.STATIC_TABLE_MAPPING  # name -> (name index, {value: full index})


def _length(data: bytes) -> bytes:
    """A string literal's length prefix, not Huffman-coded (RFC 7541 §5.2)."""
    n = len(data)
    return bytes((n,)) if n < 127 else bytes(encode_integer(n, 7))


class FieldEncoder:
    """The HPACK encoder of one connection: static table and plain literals, nothing else.

    ``hpack``'s encoder, for every request, searched its dynamic table linearly and
    Huffman-coded each literal in pure Python (the never-indexed credential every time): most
    of the agent's CPU per short request over HTTP/2. This one never inserts into the dynamic
    table (its first block sets the table's size to 0, which fits any SETTINGS_HEADER_TABLE_SIZE
    the server announces later) and never Huffman-codes, so a field's encoding depends on the
    field alone: it is computed once and then looked up (a bounded cache, one per process:
    however many connections, the cache costs at most ``MAX_CACHED`` fields). The price is bytes:
    a field is a literal each time, as long as the same field in an HTTP/1.1 head, instead of a
    one-byte index. Plain literals also cost the server's decoder least (no Huffman decoding).

    Literals are "without indexing"; secrets and ``impersonate-*`` are "never indexed". Secrets
    and ``:path`` (almost always new) are not in the cache: a secret's encoding is kept alone,
    for the next request (the agent sends the same credential each time; a rotated one
    replaces it). What ``h2`` calls: :meth:`encode` and the ``header_table_size`` attribute
    (set on SETTINGS, nothing to do: our table stays empty).
    """

    MAX_CACHED = 1024  # fields; the cache is emptied when full (per-request unique values)
    _cache: ClassVar[dict[tuple[bytes, bytes], bytes]] = {}  # shared: a field's own encoding

    __slots__ = ("_pending", "_secret", "header_table_size")

    def __init__(self) -> None:
        self.header_table_size = 0
        self._secret: tuple[tuple[bytes, bytes], bytes] = ((b"", b""), b"")
        self._pending = b"\x20"  # dynamic table size update to 0, before the first field

    def encode(self, headers: Iterable[tuple[bytes, bytes]], huffman: bool = True) -> bytes:
        """The header block of ``headers`` (``huffman`` is ``hpack``'s parameter; ignored)."""
        parts = [self._pending] if self._pending else []
        self._pending = b""
        cache = self._cache
        for field in headers:
            encoded = cache.get(field)
            if encoded is None:
                if field[0] == b":path":  # literal without indexing, name index 4 (§6.2.2)
                    encoded = b"\x04" + _length(field[1]) + field[1]
                elif field == self._secret[0]:
                    encoded = self._secret[1]
                else:
                    encoded = self._field(field[0], field[1])
            parts.append(encoded)
        return b"".join(parts)

    def _field(self, name: bytes, value: bytes) -> bytes:
        secret = name in _SECRET_FIELDS
        never = secret or name.startswith(_NEVER_INDEXED_PREFIX)
        static = _STATIC.get(name)
        if static is not None and not never and (index := static[1].get(value)) is not None:
            out = encode_integer(index, 7)  # indexed field (RFC 7541 §6.1)
            out[0] |= 0x80
            encoded = bytes(out)
        else:  # literal field without indexing (§6.2.2) or never indexed (§6.2.3)
            flag = 0x10 if never else 0x00
            if static is not None:
                out = encode_integer(static[0], 4)
                out[0] |= flag
                encoded = bytes(out) + _length(value) + value
            else:
                encoded = bytes((flag,)) + _length(name) + name + _length(value) + value
            if secret:
                self._secret = ((name, value), encoded)
                return encoded
        cache = FieldEncoder._cache
        if len(cache) >= self.MAX_CACHED:
            cache.clear()
        cache[(name, value)] = encoded
        return encoded


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
    if not all(names) or b"".join(names).translate(None, _LOWER_TCHAR):
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
