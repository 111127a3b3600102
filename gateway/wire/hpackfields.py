"""HPACK encoding without a dynamic table or Huffman coding (RFC 7541), for both directions.

The agent's HTTP/2 connections to its apiserver (:mod:`gateway.agent.h2pool`) and the front
door's HTTP/2 connections to clients (:mod:`gateway.hub.frontdoor_h2`) hand ``h2`` this
encoder instead of ``hpack``'s (see :class:`FieldEncoder`). Decoding stays ``hpack``'s.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import ClassVar

from hpack.hpack import encode_integer
from hpack.table import HeaderTable

# Fields sent "never indexed" (RFC 7541 §7.1.3: no intermediary may put them in a compression
# context): credentials and cookies (h2's own encoder did it for authorization and
# proxy-authorization), and the impersonation headers that name the hub user. The first set is
# also never cached here.
_SECRET_FIELDS = frozenset((b"authorization", b"proxy-authorization", b"cookie", b"set-cookie"))
_NEVER_INDEXED_PREFIX = b"impersonate-"
# The response fields a retaining encoder keeps: what kube-apiserver puts on every response,
# whose values say nothing private (types, lengths, dates, its priority-and-fairness uids).
# Any other field (a Service's own headers through proxy-service, or a pod's through the
# apiserver's proxy subresource, may hold a session or a secret) is encoded per block and
# kept nowhere.
RETAINED_NAMES = frozenset((
    b":status", b"content-type", b"content-length", b"content-encoding", b"cache-control",
    b"date", b"vary", b"x-content-type-options", b"strict-transport-security",
    b"x-kubernetes-pf-flowschema-uid", b"x-kubernetes-pf-prioritylevel-uid",
))
_STATIC = HeaderTable.STATIC_TABLE_MAPPING  # name -> (name index, {value: full index})


def _length(data: bytes) -> bytes:
    """A string literal's length prefix, not Huffman-coded (RFC 7541 §5.2)."""
    n = len(data)
    return bytes((n,)) if n < 127 else bytes(encode_integer(n, 7))


def _indexed(index: int) -> bytes:
    """An indexed field's representation (RFC 7541 §6.1)."""
    out = encode_integer(index, 7)
    out[0] |= 0x80
    return bytes(out)


def _name_entry(name: bytes) -> tuple[dict[bytes, bytes] | None, bytes, bool]:
    """What a field's encoding takes from its name alone: the static table's full entries for
    it, each value's indexed representation (None when never indexed), the literal's
    representation up to its value, and whether it is a secret."""
    secret = name in _SECRET_FIELDS
    never = secret or name.startswith(_NEVER_INDEXED_PREFIX)
    flag = 0x10 if never else 0x00
    static = _STATIC.get(name)
    if static is not None:
        out = encode_integer(static[0], 4)
        out[0] |= flag
        prefix = bytes(out)
    else:
        prefix = bytes((flag,)) + _length(name) + name
    full = None if static is None or never else {
        value: _indexed(index) for value, index in static[1].items()}
    return (full, prefix, secret)


# The static table's names, made once: constants of RFC 7541, nothing a peer sent.
_STATIC_NAMES = {name: _name_entry(name) for name in _STATIC}


def encode_field(name: bytes, value: bytes) -> bytes:
    """One field's encoding (``name`` lower-case), kept nowhere: a static table index for a
    full match, else a literal "without indexing" (never indexed for credentials, cookies and
    ``impersonate-*``), never Huffman-coded. For fields whose bytes a client chose: nothing of
    them outlives the call."""
    n = len(value)
    entry = _STATIC_NAMES.get(name)
    if entry is None:  # a literal name (one byte of length: names are short)
        if len(name) < 127 and n < 127 and not name.startswith(_NEVER_INDEXED_PREFIX):
            return b"\x00%c%s%c%s" % (len(name), name, n, value)
        entry = _name_entry(name)
    indexed, prefix, _ = entry
    if indexed is not None and (full := indexed.get(value)) is not None:
        return full
    if n < 127:
        return b"%s%c%s" % (prefix, n, value)
    return prefix + _length(value) + value


class NamedField:
    """:func:`encode_field` for one constant name (lower-case) and any value, the name's
    part encoded once: for a field sent with every request under a name the sender chose
    (the agent's ``audit-id`` and request-id extra), not one a client named."""

    __slots__ = ("_indexed", "_prefix")

    def __init__(self, name: bytes) -> None:
        entry = _STATIC_NAMES.get(name) or _name_entry(name)
        self._indexed, self._prefix, _ = entry

    def __call__(self, value: bytes) -> bytes:
        indexed = self._indexed
        if indexed is not None and (full := indexed.get(value)) is not None:
            return full
        n = len(value)
        if n < 127:
            return b"%s%c%s" % (self._prefix, n, value)
        return self._prefix + _length(value) + value


def encode_fields(fields: Iterable[tuple[bytes, bytes]]) -> bytes:
    """:func:`encode_field` of each field, joined: a piece of a header block (no table size
    update: :meth:`FieldEncoder.block` adds one where due). Kept by the caller for fields it
    sends again (the agent's identity headers, per hub user)."""
    return b"".join([encode_field(name, value) for name, value in fields])


class FieldEncoder:
    """The HPACK encoder of one connection: static table and plain literals, nothing else.

    ``hpack``'s encoder, for every header block, searched its dynamic table linearly and
    Huffman-coded each new literal in pure Python (the never-indexed credential every time):
    most of the agent's CPU per short request over HTTP/2, and a large part of the front door's
    per response (audit-id and date change every time). This one never inserts into the dynamic
    table (its first block sets the table's size to 0, which fits any SETTINGS_HEADER_TABLE_SIZE
    the peer announces later) and never Huffman-codes, so a field's encoding depends on the
    field alone. The price is bytes: a field is a literal each time, as long as the same field
    in an HTTP/1.1 head, instead of a one-byte index. Plain literals also cost the peer's
    decoder least (no Huffman decoding).

    ``retain``: whether encodings are kept for the next block (a bounded cache, one per
    process: however many connections, it costs at most ``MAX_CACHED`` fields and names), and
    then only of the fields in :data:`RETAINED_NAMES` and the static table's full entries
    (constants of RFC 7541). Only for fields no client chose: the front door's responses retain;
    the agent's requests (``gateway.wire.h2client``) carry a client's header values through
    the gateway, which must not outlive their request (a value may hold a secret), so its
    encoder retains nothing (:func:`encode_field`), and the agent keeps its own fields'
    encoding per hub user itself (``gateway.agent.exchange``).

    Literals are "without indexing"; secrets and ``impersonate-*`` are "never indexed". Secrets
    and ``:path`` (almost always new) are not in the cache: a secret's encoding is kept alone,
    for the next block of the same connection (a response's ``set-cookie`` is a secret too).
    What ``h2`` calls: :meth:`encode` and the ``header_table_size`` attribute (set on SETTINGS,
    nothing to do: our table stays empty).
    """

    # fields; the cache is emptied when full (per-request unique values)
    MAX_CACHED: ClassVar[int] = 1024
    _cache: ClassVar[dict[tuple[bytes, bytes], bytes]] = {}  # shared: a field's own encoding
    _names: ClassVar[dict[bytes, tuple[dict[bytes, bytes] | None, bytes, bool]]] = {}  # _name()

    __slots__ = ("_pending", "_secret", "header_table_size", "retain")

    def __init__(self, *, retain: bool = True) -> None:
        self.header_table_size = 0
        self.retain = retain
        self._secret: tuple[tuple[bytes, bytes], bytes] = ((b"", b""), b"")
        self._pending = b"\x20"  # dynamic table size update to 0, before the first field

    def block(self, fields: bytes) -> bytes:
        """A header block of fields already encoded (:func:`encode_fields`), with the table
        size update the connection's first block carries."""
        if not self._pending:
            return fields
        pending, self._pending = self._pending, b""
        return pending + fields

    def encode(self, headers: Iterable[tuple[bytes, bytes]], huffman: bool = True) -> bytes:
        """The header block of ``headers`` (``huffman`` is ``hpack``'s parameter; ignored)."""
        parts = [self._pending] if self._pending else []
        self._pending = b""
        if not self.retain:
            parts += [encode_field(name, value) for name, value in headers]
            return b"".join(parts)
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
        indexed, prefix, secret = self._name(name)
        if indexed is not None and (full := indexed.get(value)) is not None:
            encoded = full  # indexed field (RFC 7541 §6.1)
        else:  # literal field without indexing (§6.2.2) or never indexed (§6.2.3)
            encoded = prefix + _length(value) + value
            if secret:
                self._secret = ((name, value), encoded)
                return encoded
            if name not in RETAINED_NAMES:
                return encoded
        cache = FieldEncoder._cache
        if len(cache) >= self.MAX_CACHED:
            cache.clear()
        cache[(name, value)] = encoded
        return encoded

    def _name(self, name: bytes) -> tuple[dict[bytes, bytes] | None, bytes, bool]:
        """:func:`_name_entry`, kept per name (a bounded cache, as the fields'): a field seen
        for the first time (a response's audit-id or date) is then its value's length and bytes
        after that prefix."""
        entry = _STATIC_NAMES.get(name) or FieldEncoder._names.get(name)
        if entry is not None:
            return entry
        entry = _name_entry(name)
        names = FieldEncoder._names
        if len(names) >= self.MAX_CACHED:
            names.clear()
        names[name] = entry
        return entry
