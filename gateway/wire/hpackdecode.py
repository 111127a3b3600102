"""HPACK header block decoding (RFC 7541), sans-IO: a block in, its fields out.

The HTTP/2 front door's server core (:mod:`gateway.wire.h2server`) decodes every request's
header block. ``hpack``'s decoder cost about 1.3 µs per indexed field and Huffman-decoded a
never-indexed credential (nghttp2 and curl send ``authorization`` that way on every request)
a nibble at a time, every time; this one is built for that path:

* one list holds the whole index space: a placeholder at 0, the static table at 1-61, the
  dynamic table from 62 on, newest first; so an indexed field is one list lookup (its size, for
  the header-list bound, is one lookup in a parallel list);
* Huffman strings are decoded a byte at a time, by table lookups (:class:`_HuffmanAutomaton`),
  and the value of a never-indexed or unindexed literal that repeats the previous one's coded
  bytes (the same credential, request after request) is not decoded again.

What it refuses, each a :class:`HPACKDecodeError` (the caller sends COMPRESSION_ERROR), and
after which the decoder is not to be used again (its table may be half updated, as the peer's
never will be): index 0 and indices past the tables (§2.3.3); a dynamic table size update after
a field or above ``max_table_size``, our SETTINGS_HEADER_TABLE_SIZE (§4.2, §6.3); integers over
``MAX_INTEGER`` or with more than ``MAX_INTEGER_BYTES`` continuation bytes (§5.1); integers and
strings cut off by the end of the block; Huffman strings that contain EOS, end in more than 7
bits of padding or in padding that is not all ones (§5.2). A block whose fields add up to more
than ``max_header_list_size`` (name + value + 32 each, RFC 9113 §6.5.2) raises
:class:`HeaderListTooLarge` at the first field past the limit (an HPACK bomb, a large entry
referenced again and again, costs no more than the limit: fields from the table are shared, not
copied). Whether a literal was "never indexed" is not reported: the front door re-encodes no
request.
"""

from __future__ import annotations

from typing import TypeAlias

from mypy_extensions import mypyc_attr

MAX_INTEGER = 2**32 - 1
MAX_INTEGER_BYTES = 5  # continuation bytes after the prefix: 35 bits, more than MAX_INTEGER

Field: TypeAlias = tuple[bytes, bytes]


@mypyc_attr(native_class=False)
class HPACKDecodeError(Exception):
    """A header block that is not valid HPACK: a connection error, COMPRESSION_ERROR."""


@mypyc_attr(native_class=False)
class HeaderListTooLarge(HPACKDecodeError):
    """A header block whose fields add up to more than the header-list limit."""


# RFC 7541 Appendix A, index 1 to 61.
_STATIC: tuple[Field, ...] = (
    (b":authority", b""), (b":method", b"GET"), (b":method", b"POST"), (b":path", b"/"),
    (b":path", b"/index.html"), (b":scheme", b"http"), (b":scheme", b"https"),
    (b":status", b"200"), (b":status", b"204"), (b":status", b"206"), (b":status", b"304"),
    (b":status", b"400"), (b":status", b"404"), (b":status", b"500"), (b"accept-charset", b""),
    (b"accept-encoding", b"gzip, deflate"), (b"accept-language", b""), (b"accept-ranges", b""),
    (b"accept", b""), (b"access-control-allow-origin", b""), (b"age", b""), (b"allow", b""),
    (b"authorization", b""), (b"cache-control", b""), (b"content-disposition", b""),
    (b"content-encoding", b""), (b"content-language", b""), (b"content-length", b""),
    (b"content-location", b""), (b"content-range", b""), (b"content-type", b""),
    (b"cookie", b""), (b"date", b""), (b"etag", b""), (b"expect", b""), (b"expires", b""),
    (b"from", b""), (b"host", b""), (b"if-match", b""), (b"if-modified-since", b""),
    (b"if-none-match", b""), (b"if-range", b""), (b"if-unmodified-since", b""),
    (b"last-modified", b""), (b"link", b""), (b"location", b""), (b"max-forwards", b""),
    (b"proxy-authenticate", b""), (b"proxy-authorization", b""), (b"range", b""),
    (b"referer", b""), (b"refresh", b""), (b"retry-after", b""), (b"server", b""),
    (b"set-cookie", b""), (b"strict-transport-security", b""), (b"transfer-encoding", b""),
    (b"user-agent", b""), (b"vary", b""), (b"via", b""), (b"www-authenticate", b""),
)
_DYNAMIC = len(_STATIC) + 1  # the index of the newest dynamic table entry

# RFC 7541 Appendix B: the code length of each symbol, 0-255 then EOS (256). The code is
# canonical (codes of one length are consecutive, in symbol order, after the shorter ones), so
# the lengths are the whole table.
_CODE_LENGTHS = bytes.fromhex(
    "0d171c1c1c1c1c1c1c181e1c1c1e1c1c1c1c1c1c1c1c1e1c1c1c1c1c1c1c1c1c060a0a0c0d06080b0a0a080b"
    "080606060505050606060606060607080f060c0a0d06070707070707070707070707070707070707070707070807"
    "080d130d0e060f05060506050606060507070606060506070605050607070707070f0b0e0d1c1416141416161617"
    "16171717171718171818161718171717171516171617171816151416161717151716161815161717151516151716"
    "171714161616171616171a1a1413161716191a1a1a1b1b1a181913151a1b1b1a1b1815151a1a1c1b1b1b14181415"
    "161515171616191918181a171a1b1a1a1b1b1b1b1b1c1b1b1b1b1b1a1e")
_EOS = 256

# A row of the Huffman automaton (see _HuffmanAutomaton)
_Row: TypeAlias = "list[tuple[_Row, bytes]]"


class _HuffmanAutomaton:
    """The byte-at-a-time Huffman decoder: a state is a node of the code tree (the bits read
    since the last symbol), its row says, for each next byte, the row of the state after it
    and the symbols that byte completed.

    The code tree and its nibble steps (256 states x 16) are built at import, in a few
    milliseconds; a byte row (two nibble steps composed, 256 entries) is built the first time a
    string reaches its state. Strings of the usual characters visit a few dozen of the 257
    states; all of them together take about 6 MB, once per process. A string that holds EOS
    goes to a dead state that reads everything and never accepts."""

    def __init__(self) -> None:
        # The code tree: children[node] = [zero, one]; a leaf is ~symbol (negative).
        children: list[list[int]] = [[0, 0]]
        code, previous = -1, 0
        for symbol in sorted(range(_EOS + 1), key=lambda s: (_CODE_LENGTHS[s], s)):
            length = _CODE_LENGTHS[symbol]
            code = (code + 1) << (length - previous)
            previous = length
            node = 0
            for shift in range(length - 1, 0, -1):
                bit = code >> shift & 1
                if not children[node][bit]:
                    children.append([0, 0])
                    children[node][bit] = len(children) - 1
                node = children[node][bit]
            children[node][code & 1] = ~symbol
        dead = len(children)
        self.nibbles: list[list[tuple[int, bytes]]] = []
        for state in range(dead):
            steps = []
            for nibble in range(16):
                node, out = state, bytearray()
                for shift in (3, 2, 1, 0):
                    child = children[node][nibble >> shift & 1]
                    if child >= 0:
                        node = child
                    elif ~child == _EOS:
                        node = dead
                        break
                    else:
                        out.append(~child)
                        node = 0
                steps.append((node, bytes(out)))
            self.nibbles.append(steps)
        self.nibbles.append([(dead, b"")] * 16)
        self.rows: list[_Row] = [[] for _ in self.nibbles]  # filled by fill()
        self.state_of = {id(row): state for state, row in enumerate(self.rows)}
        self.start = self.rows[0]
        accepting, node = [self.start], 0
        for _ in range(7):  # 1 to 7 bits of padding, all ones (§5.2)
            node = children[node][1]
            accepting.append(self.rows[node])
        self.accepting = frozenset(map(id, accepting))

    def fill(self, row: _Row) -> None:
        """Build the (empty) ``row``: whole, in one slice assignment, so that a reader never
        sees part of it (were two threads to decode at once, both would build the same row)."""
        rows, nibbles = self.rows, self.nibbles
        built = [(rows[end], first + second)
                 for middle, first in nibbles[self.state_of[id(row)]]
                 for end, second in nibbles[middle]]
        if not row:
            row[:] = built


_HUFFMAN = _HuffmanAutomaton()


def huffman_decode(data: bytes) -> bytes:
    """The bytes that the Huffman-coded ``data`` holds (RFC 7541 §5.2)."""
    while True:
        row = _HUFFMAN.start
        out: list[bytes] = []
        emit = out.append
        try:
            for byte in data:
                row, symbols = row[byte]
                emit(symbols)
        except IndexError:  # a row not built yet: build it, start again (257 times at most)
            _HUFFMAN.fill(row)
            continue
        if id(row) not in _HUFFMAN.accepting:
            raise HPACKDecodeError("Huffman string with EOS or bad padding")
        return b"".join(out)


def _integer(block: bytes, pos: int, value: int) -> tuple[int, int]:
    """An integer whose prefix was all ones (``value``), continued from ``pos`` (§5.1): the
    integer and the position after it."""
    for shift in range(0, 7 * MAX_INTEGER_BYTES, 7):
        try:
            byte = block[pos]
        except IndexError:
            raise HPACKDecodeError("integer cut off by the end of the block") from None
        pos += 1
        value += (byte & 0x7F) << shift
        if not byte & 0x80:
            if value > MAX_INTEGER:
                raise HPACKDecodeError("integer too large")
            return value, pos
    raise HPACKDecodeError("integer with too many continuation bytes")


class Decoder:
    """The HPACK decoding context of one HTTP/2 connection (the peer's encoder's mirror).

    ``max_header_list_size`` bounds each decoded block (see the module docstring);
    ``max_table_size`` is the SETTINGS_HEADER_TABLE_SIZE we announced, the most the peer's
    dynamic table size updates may ask for (and the table's size until one does)."""

    __slots__ = ("_fields", "_repeat", "_sizes", "max_header_list_size", "max_table_size",
                 "table_limit", "table_size")

    def __init__(self, max_header_list_size: int, max_table_size: int = 4096) -> None:
        self.max_header_list_size = max_header_list_size
        self.max_table_size = max_table_size
        self.table_limit = max_table_size  # the dynamic table's maximum size now (§4.2)
        self.table_size = 0  # what its entries take (§4.1)
        # Index i of the index space (§2.3.3), and that field's size (§4.1). Index 0 is no
        # field: a placeholder there keeps the list's type simple, decode() never reads it.
        self._fields: list[Field] = [(b"", b""), *_STATIC]
        self._sizes: list[int] = [0, *(len(n) + len(v) + 32 for n, v in _STATIC)]
        # The last Huffman-coded value of a literal not indexed, coded and decoded.
        self._repeat: tuple[bytes, bytes] = (b"", b"")

    @property
    def dynamic_table(self) -> list[Field]:
        """The dynamic table's entries, newest first (for tests and diagnostics)."""
        return self._fields[_DYNAMIC:]

    def decode(self, block: bytes) -> list[Field]:
        """The fields of one complete header block, in order. Raises :class:`HPACKDecodeError`
        or :class:`HeaderListTooLarge` (see the module docstring)."""
        fields, sizes = self._fields, self._sizes
        count = len(fields)  # indices below this are in a table
        limit = self.max_header_list_size
        out: list[Field] = []
        size = 0  # of the header list so far (RFC 9113 §6.5.2)
        pos, end = 0, len(block)
        while pos < end:
            byte = block[pos]
            pos += 1
            if byte & 0x80:  # indexed field (§6.1)
                index = byte & 0x7F
                if index == 0x7F:
                    index, pos = _integer(block, pos, index)
                if 0 < index < count:
                    out.append(fields[index])
                    size += sizes[index]
                    if size > limit:
                        raise HeaderListTooLarge(f"header list over {limit} bytes")
                    continue
                raise HPACKDecodeError(f"index {index} is in no table")
            if byte & 0x40:  # literal with incremental indexing (§6.2.1)
                index = byte & 0x3F
                if index == 0x3F:
                    index, pos = _integer(block, pos, index)
            elif byte & 0x20:  # dynamic table size update (§6.3)
                if out:
                    raise HPACKDecodeError("table size update after a field")
                index = byte & 0x1F
                if index == 0x1F:
                    index, pos = _integer(block, pos, index)
                if index > self.max_table_size:
                    raise HPACKDecodeError(f"table size {index} over {self.max_table_size}")
                self.table_limit = index
                self._evict(index)
                count = len(fields)
                continue
            else:  # literal without indexing or never indexed (§6.2.2, §6.2.3)
                index = byte & 0x0F
                if index == 0x0F:
                    index, pos = _integer(block, pos, index)
            if index:
                if index >= count:
                    raise HPACKDecodeError(f"name index {index} is in no table")
                name = fields[index][0]
            else:
                name, pos = self._string(block, pos, False)
            value, pos = self._string(block, pos, not byte & 0x40)
            field_size = len(name) + len(value) + 32
            size += field_size
            if size > limit:
                raise HeaderListTooLarge(f"header list over {limit} bytes")
            field = (name, value)
            out.append(field)
            if byte & 0x40:
                self._insert(field, field_size)
                count = len(fields)
        return out

    def _string(self, block: bytes, pos: int, repeatable: bool) -> tuple[bytes, int]:
        """The string literal at ``pos`` (§5.2) and the position after it. A ``repeatable``
        Huffman string equal to the previous one is not decoded again."""
        try:
            byte = block[pos]
        except IndexError:
            raise HPACKDecodeError("string cut off by the end of the block") from None
        length = byte & 0x7F
        pos += 1
        if length == 0x7F:
            length, pos = _integer(block, pos, length)
        stop = pos + length
        if stop > len(block):
            raise HPACKDecodeError("string cut off by the end of the block")
        data = block[pos:stop]
        if byte & 0x80:
            if not repeatable:
                return huffman_decode(data), stop
            coded, decoded = self._repeat
            if data != coded:
                decoded = huffman_decode(data)
                self._repeat = (data, decoded)
            return decoded, stop
        return data, stop

    def _insert(self, field: Field, field_size: int) -> None:
        """Add ``field`` to the dynamic table, evicting the oldest entries to make room; a
        field larger than the whole table empties it and is not added (§4.4)."""
        if field_size > self.table_limit:
            self._evict(0)
            return
        self._evict(self.table_limit - field_size)
        self._fields.insert(_DYNAMIC, field)
        self._sizes.insert(_DYNAMIC, field_size)
        self.table_size += field_size

    def _evict(self, room: int) -> None:
        """Drop the oldest dynamic table entries until the table takes at most ``room``."""
        fields, sizes = self._fields, self._sizes
        while self.table_size > room:
            fields.pop()
            self.table_size -= sizes.pop()
