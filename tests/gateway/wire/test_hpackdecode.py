"""gateway.wire.hpackdecode: HPACK decoding (RFC 7541). The RFC's Appendix C examples byte for
byte, round trips against ``hpack``'s encoder and decoder, every malformed representation
refused, HPACK bombs stopped at the header-list limit. Pure: blocks in, fields out."""

from __future__ import annotations

import random
import tracemalloc

import hpack
import pytest
from hpack.huffman_constants import REQUEST_CODES, REQUEST_CODES_LENGTH

from gateway.wire.hpackdecode import (
    MAX_INTEGER,
    Decoder,
    HeaderListTooLarge,
    HPACKDecodeError,
    huffman_decode,
)

Fields = list[tuple[bytes, bytes]]
LIMIT = 65536


def block(hexdump: str) -> bytes:
    return bytes.fromhex(hexdump.replace(" ", ""))


def huffman(data: bytes, eos: bool = False, padding: str | None = None) -> bytes:
    """``data`` Huffman-coded with the code table hpack holds (RFC 7541 Appendix B), then EOS
    if asked, then ``padding`` (default: ones up to the byte)."""
    bits = "".join(format(REQUEST_CODES[b], f"0{REQUEST_CODES_LENGTH[b]}b") for b in data)
    if eos:
        bits += format(REQUEST_CODES[256], f"0{REQUEST_CODES_LENGTH[256]}b")
    bits += "1" * (-len(bits) % 8) if padding is None else padding
    assert len(bits) % 8 == 0
    return int(bits, 2).to_bytes(len(bits) // 8, "big") if bits else b""


def coded(data: bytes) -> bytes:
    """A Huffman string literal (§5.2) of the already coded ``data``."""
    assert len(data) < 127
    return bytes([0x80 | len(data)]) + data


def table_size(decoder: Decoder) -> int:
    return sum(len(n) + len(v) + 32 for n, v in decoder.dynamic_table)


# RFC 7541 C.2: one representation each, a fresh decoder each.

@pytest.mark.parametrize(("hexdump", "fields", "table"), [
    ("400a 6375 7374 6f6d 2d6b 6579 0d63 7573 746f 6d2d 6865 6164 6572",  # C.2.1
     [(b"custom-key", b"custom-header")], [(b"custom-key", b"custom-header")]),
    ("040c 2f73 616d 706c 652f 7061 7468",  # C.2.2 without indexing
     [(b":path", b"/sample/path")], []),
    ("1008 7061 7373 776f 7264 0673 6563 7265 74",  # C.2.3 never indexed
     [(b"password", b"secret")], []),
    ("82", [(b":method", b"GET")], []),  # C.2.4
])
def test_rfc7541_c2_field_representations(hexdump: str, fields: Fields, table: Fields) -> None:
    decoder = Decoder(LIMIT)
    assert decoder.decode(block(hexdump)) == fields
    assert decoder.dynamic_table == table


REQUESTS = [  # C.3 / C.4: the fields, then the dynamic table after the block, newest first
    ([(b":method", b"GET"), (b":scheme", b"http"), (b":path", b"/"),
      (b":authority", b"www.example.com")],
     [(b":authority", b"www.example.com")]),
    ([(b":method", b"GET"), (b":scheme", b"http"), (b":path", b"/"),
      (b":authority", b"www.example.com"), (b"cache-control", b"no-cache")],
     [(b"cache-control", b"no-cache"), (b":authority", b"www.example.com")]),
    ([(b":method", b"GET"), (b":scheme", b"https"), (b":path", b"/index.html"),
      (b":authority", b"www.example.com"), (b"custom-key", b"custom-value")],
     [(b"custom-key", b"custom-value"), (b"cache-control", b"no-cache"),
      (b":authority", b"www.example.com")]),
]
REQUEST_TABLE_SIZES = [57, 110, 164]


@pytest.mark.parametrize("blocks", [
    [  # C.3, no Huffman coding
        "8286 8441 0f77 7777 2e65 7861 6d70 6c65 2e63 6f6d",
        "8286 84be 5808 6e6f 2d63 6163 6865",
        "8287 85bf 400a 6375 7374 6f6d 2d6b 6579 0c63 7573 746f 6d2d 7661 6c75 65",
    ],
    [  # C.4, Huffman coded
        "8286 8441 8cf1 e3c2 e5f2 3a6b a0ab 90f4 ff",
        "8286 84be 5886 a8eb 1064 9cbf",
        "8287 85bf 4088 25a8 49e9 5ba9 7d7f 8925 a849 e95b b8e8 b4bf",
    ],
], ids=["C.3", "C.4"])
def test_rfc7541_c3_c4_requests_share_one_table(blocks: list[str]) -> None:
    decoder = Decoder(LIMIT)
    for hexdump, (fields, table), size in zip(blocks, REQUESTS, REQUEST_TABLE_SIZES, strict=True):
        assert decoder.decode(block(hexdump)) == fields
        assert decoder.dynamic_table == table
        assert decoder.table_size == size == table_size(decoder)


DATE1, DATE2 = b"Mon, 21 Oct 2013 20:13:21 GMT", b"Mon, 21 Oct 2013 20:13:22 GMT"
LOCATION = b"https://www.example.com"
COOKIE = b"foo=ASDJKHQKBZXOQWEOPIUAXQWEOIU; max-age=3600; version=1"
RESPONSES = [  # C.5 / C.6, a 256-byte table: the third response evicts
    ([(b":status", b"302"), (b"cache-control", b"private"), (b"date", DATE1),
      (b"location", LOCATION)],
     [(b"location", LOCATION), (b"date", DATE1), (b"cache-control", b"private"),
      (b":status", b"302")]),
    ([(b":status", b"307"), (b"cache-control", b"private"), (b"date", DATE1),
      (b"location", LOCATION)],
     [(b":status", b"307"), (b"location", LOCATION), (b"date", DATE1),
      (b"cache-control", b"private")]),
    ([(b":status", b"200"), (b"cache-control", b"private"), (b"date", DATE2),
      (b"location", LOCATION), (b"content-encoding", b"gzip"), (b"set-cookie", COOKIE)],
     [(b"set-cookie", COOKIE), (b"content-encoding", b"gzip"), (b"date", DATE2)]),
]
RESPONSE_TABLE_SIZES = [222, 222, 215]


@pytest.mark.parametrize("blocks", [
    [  # C.5, no Huffman coding
        "4803 3330 3258 0770 7269 7661 7465 611d 4d6f 6e2c 2032 3120 4f63 7420 3230 3133"
        " 2032 303a 3133 3a32 3120 474d 546e 1768 7474 7073 3a2f 2f77 7777 2e65 7861 6d70"
        " 6c65 2e63 6f6d",
        "4803 3330 37c1 c0bf",
        "88c1 611d 4d6f 6e2c 2032 3120 4f63 7420 3230 3133 2032 303a 3133 3a32 3220 474d"
        " 54c0 5a04 677a 6970 7738 666f 6f3d 4153 444a 4b48 514b 425a 584f 5157 454f 5049"
        " 5541 5851 5745 4f49 553b 206d 6178 2d61 6765 3d33 3630 303b 2076 6572 7369 6f6e"
        " 3d31",
    ],
    [  # C.6, Huffman coded
        "4882 6402 5885 aec3 771a 4b61 96d0 7abe 9410 54d4 44a8 2005 9504 0b81 66e0 82a6"
        " 2d1b ff6e 919d 29ad 1718 63c7 8f0b 97c8 e9ae 82ae 43d3",
        "4883 640e ffc1 c0bf",
        "88c1 6196 d07a be94 1054 d444 a820 0595 040b 8166 e084 a62d 1bff c05a 839b d9ab"
        " 77ad 94e7 821d d7f2 e6c7 b335 dfdf cd5b 3960 d5af 2708 7f36 72c1 ab27 0fb5 291f"
        " 9587 3160 65c0 03ed 4ee5 b106 3d50 07",
    ],
], ids=["C.5", "C.6"])
def test_rfc7541_c5_c6_responses_evict_from_a_256_byte_table(blocks: list[str]) -> None:
    decoder = Decoder(LIMIT, max_table_size=256)
    for hexdump, (fields, table), size in zip(blocks, RESPONSES, RESPONSE_TABLE_SIZES,
                                               strict=True):
        assert decoder.decode(block(hexdump)) == fields
        assert decoder.dynamic_table == table
        assert decoder.table_size == size == table_size(decoder)


# Round trips: whatever hpack's encoder writes, we decode as hpack's decoder does.

NAMES = [b":method", b":path", b":authority", b"accept", b"user-agent", b"authorization",
         b"cookie", b"x-request-id", b"content-type", b"impersonate-user", b"x-a"]


def random_fields(rng: random.Random) -> list[tuple[bytes, bytes]]:
    fields: list[tuple[bytes, bytes]] = []
    for _ in range(rng.randint(0, 14)):
        name = rng.choice(NAMES) if rng.random() < 0.8 else \
            bytes(rng.choice(b"abcdefghijklmnopqrstuvwxyz-") for _ in range(rng.randint(1, 30)))
        kind = rng.random()
        if kind < 0.3:  # a value seen before: indexed
            value = rng.choice([b"GET", b"/", b"application/json", b"v1", b""])
        elif kind < 0.9:  # text
            value = bytes(rng.randrange(0x20, 0x7F) for _ in range(rng.randint(0, 120)))
        else:  # any byte, long codes included
            value = bytes(rng.randrange(256) for _ in range(rng.randint(0, 300)))
        field = (name, value)
        if rng.random() < 0.15:
            field = hpack.NeverIndexedHeaderTuple(name, value)
        fields.append(field)
    return fields


@pytest.mark.parametrize("seed", range(6))
def test_round_trips_against_hpack_with_table_churn_and_size_updates(seed: int) -> None:
    rng = random.Random(seed)
    encoder, reference, decoder = hpack.Encoder(), hpack.Decoder(LIMIT), Decoder(LIMIT)
    for _ in range(150):  # bounded: 150 blocks a seed
        if rng.random() < 0.1:  # a size update (or two) at the start of the next block
            encoder.header_table_size = rng.choice([0, 64, 300, 1024, 4096])
        fields = random_fields(rng)
        data = encoder.encode(fields, huffman=rng.random() < 0.7)
        expected = [tuple(f) for f in reference.decode(data, raw=True)]
        assert decoder.decode(data) == expected == [tuple(f) for f in fields]
        assert decoder.dynamic_table == list(reference.header_table.dynamic_entries)
        assert decoder.table_size == reference.header_table._current_size == table_size(decoder)
        assert decoder.table_limit == reference.header_table_size


@pytest.mark.parametrize("huffman_coded", [False, True])
def test_round_trips_at_the_integer_boundaries(huffman_coded: bool) -> None:
    """String lengths and indices on each side of the prefix and continuation-byte limits."""
    encoder, reference, decoder = hpack.Encoder(), hpack.Decoder(2**20), Decoder(2**20)
    lengths = [0, 1, 126, 127, 128, 254, 255, 256, 16382, 16383, 16384, 16385]
    fields = [(b"x-%d" % n, bytes(range(256)) * (n // 256) + bytes(range(n % 256)))
              for n in lengths]
    fields += [(b"n" * n, b"v") for n in (126, 127, 128)]
    for start in range(0, len(fields), 3):  # enough churn to reach indices past 127
        chunk = fields[start:start + 3]
        data = encoder.encode(chunk + fields[:start][-3:], huffman=huffman_coded)
        assert decoder.decode(data) == [tuple(f) for f in reference.decode(data, raw=True)]
    many = [(b"k%d" % n, b"v") for n in range(100, 200)]  # 100 entries, 3700 bytes
    data = encoder.encode(many, huffman=huffman_coded)
    assert decoder.decode(data) == many
    data = encoder.encode(many[::-1], huffman=huffman_coded)  # all indexed, 62 to 161
    assert len(data) == 65 + 35 * 2 and data.endswith(bytes([0xFF, 161 - 127]))  # 62-126, 127-161
    assert decoder.decode(data) == many[::-1]


def test_never_indexed_and_unindexed_literals_are_not_inserted() -> None:
    decoder = Decoder(LIMIT)
    never = b"\x10" + bytes([0x80 | len(huffman(b"x-token"))]) + huffman(b"x-token") \
        + bytes([0x80 | len(huffman(b"Bearer s3cret"))]) + huffman(b"Bearer s3cret")
    unindexed = b"\x0f\x08" + b"\x07plainer"  # name index 23 (authorization), 4-bit prefix
    assert decoder.decode(never + unindexed) == [(b"x-token", b"Bearer s3cret"),
                                                 (b"authorization", b"plainer")]
    assert decoder.dynamic_table == [] and decoder.table_size == 0
    with pytest.raises(HPACKDecodeError):  # and no index reaches one
        decoder.decode(b"\xbe")


def test_a_repeated_never_indexed_credential_decodes_the_same_each_time() -> None:
    """The decoded value of a repeated Huffman literal is reused; a different one is not."""
    encoder, decoder = hpack.Encoder(), Decoder(LIMIT)
    tokens = [b"Bearer " + bytes(random.Random(n).choices(b"abcXYZ019-_.", k=50))
              for n in range(3)]
    for token in [tokens[0], tokens[0], tokens[1], tokens[0], tokens[2], tokens[2]]:
        fields = [(b":method", b"GET"), hpack.NeverIndexedHeaderTuple(b"authorization", token),
                  (b"x-unindexed", token)]
        assert decoder.decode(encoder.encode(fields)) == [tuple(f) for f in fields]


def test_size_updates_only_at_the_start_and_never_over_the_settings() -> None:
    decoder = Decoder(LIMIT, max_table_size=4096)
    decoder.decode(b"\x40\x01a\x01b")  # (a, b), 34 bytes
    assert decoder.dynamic_table == [(b"a", b"b")]
    assert decoder.decode(b"\x20\x3f\xe1\x1f\x82") == [(b":method", b"GET")]  # 0, then 4096
    assert decoder.dynamic_table == [] and decoder.table_limit == 4096
    decoder.decode(b"\x3f\x02\x40\x01a\x01b")  # 33: too small for the 34-byte entry (§4.4)
    assert decoder.dynamic_table == [] and decoder.table_limit == 33
    with pytest.raises(HPACKDecodeError, match="after a field"):
        Decoder(LIMIT).decode(b"\x82\x20")
    with pytest.raises(HPACKDecodeError, match="4097 over 4096"):
        Decoder(LIMIT).decode(b"\x3f\xe2\x1f")
    with pytest.raises(HPACKDecodeError, match="257 over 256"):
        Decoder(LIMIT, max_table_size=256).decode(b"\x3f\xe2\x01")


def test_an_entry_evicts_the_oldest_until_it_fits() -> None:
    decoder = Decoder(LIMIT, max_table_size=100)
    decoder.decode(b"\x40\x01a\x0a0123456789")  # 43
    decoder.decode(b"\x40\x01b\x0a0123456789")  # 43: 86
    decoder.decode(b"\x40\x01c\x01x")  # 34: evicts a
    assert decoder.dynamic_table == [(b"c", b"x"), (b"b", b"0123456789")]
    assert decoder.decode(b"\xbe\xbf") == [(b"c", b"x"), (b"b", b"0123456789")]
    decoder.decode(b"\x7f\x00\x60" + b"y" * 96)  # name from index 63, too large: empties
    assert decoder.dynamic_table == [] and decoder.table_size == 0


@pytest.mark.parametrize(("data", "why"), [
    (b"\x80", "index 0 is in no table"),
    (b"\xbe", "index 62 is in no table"),  # the dynamic table is empty
    (b"\xff\x80\x01", "index 255 is in no table"),
    (b"\x7e\x01a", "name index 62 is in no table"),
    (b"\x0f\x80\x01\x01a", "name index 143 is in no table"),
    (b"\xff", "integer cut off"),
    (b"\xff\x80", "integer cut off"),
    (b"\xff\x80\x80\x80\x80\x80\x01", "too many continuation bytes"),
    (b"\xff\xff\xff\xff\xff\x7f", "integer too large"),  # 127 + 2**35 - 1
    (b"\x04", "string cut off"),
    (b"\x40", "string cut off"),
    (b"\x40\x01a", "string cut off"),
    (b"\x00\x05ab", "string cut off"),
    (b"\x04\x7f\xff\xff\xff\x0f", "string cut off"),  # 31 MB, none of it there
    (b"\x04" + coded(huffman(b"a", eos=True)), "EOS"),
    (b"\x04" + coded(huffman(b"ab", eos=True, padding="1" * 7)), "EOS"),  # 5 + 6 + 30 + 7
    (b"\x04" + coded(huffman(b"", eos=True, padding="11")), "EOS"),  # EOS alone, 32 bits
    (b"\x04" + coded(huffman(b"a", padding="11111111111")), "padding"),  # 11 bits
    (b"\x04" + coded(b"\xff"), "padding"),  # 8 bits of ones
    (b"\x04" + coded(huffman(b"a", padding="110")), "padding"),  # not all ones
    (b"\x04" + coded(huffman(b"a", padding="000")), "padding"),
    (b"\x04" + coded(huffman(b"aaaaa", padding="1111110")), "padding"),  # 7 bits, a zero
])
def test_malformed_blocks_are_refused(data: bytes, why: str) -> None:
    with pytest.raises(HPACKDecodeError, match=why) as raised:
        Decoder(LIMIT).decode(b"\x82" + data)
    assert type(raised.value) is HPACKDecodeError


def test_integers_up_to_the_bound_decode() -> None:
    assert MAX_INTEGER == 2**32 - 1
    with pytest.raises(HPACKDecodeError, match="string cut off"):  # the length was read
        Decoder(LIMIT).decode(b"\x04\x7f\x80\xff\xff\xff\x0f")  # 127 + 2**32 - 128
    with pytest.raises(HPACKDecodeError, match="integer too large"):
        Decoder(LIMIT).decode(b"\x04\x7f\x81\xff\xff\xff\x0f")


def test_huffman_decodes_every_symbol_and_short_padding() -> None:
    everything = bytes(range(256)) * 2
    assert huffman_decode(huffman(everything)) == everything
    assert huffman_decode(b"") == b""
    paddings = set()
    for n in range(1, 9):  # 5n bits: every padding length from 0 to 7
        assert huffman_decode(huffman(b"a" * n)) == b"a" * n
        paddings.add(-5 * n % 8)
    assert paddings == set(range(8))
    assert huffman_decode(huffman(b"&", padding="")) == b"&"  # 8 bits exactly
    assert huffman_decode(huffman(b"0", padding="111")) == b"0"


def test_header_list_limit_counts_name_value_and_32() -> None:
    fields = b"\x82\x84"  # :method GET (42), :path / (38)
    assert Decoder(80).decode(fields) == [(b":method", b"GET"), (b":path", b"/")]
    with pytest.raises(HeaderListTooLarge):
        Decoder(79).decode(fields)
    literal = b"\x00\x01a\x02bc"  # 35
    assert Decoder(35).decode(literal) == [(b"a", b"bc")]
    with pytest.raises(HeaderListTooLarge):
        Decoder(34).decode(literal)


def test_an_hpack_bomb_stops_at_the_limit_with_bounded_memory() -> None:
    """A 4 KB entry referenced 100 times: HeaderListTooLarge at the fourth reference, before the
    rest of the block is even read (an index 0 there would be a different error), and no
    copy of the entry made."""
    entry = b"\x40\x01x\x7f\xa1\x1e" + b"v" * 4000  # 127 + 33 + 30*128: a 4033-byte entry
    bomb = entry + b"\xbe" * 100 + b"\x80"
    decoder = Decoder(16384)
    tracemalloc.start()
    try:
        with pytest.raises(HeaderListTooLarge):
            decoder.decode(bomb)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 20_000  # the entry's value once (4 KB) and small change; 100 copies: 400 KB
    assert decoder.dynamic_table == [(b"x", b"v" * 4000)]


def test_literal_floods_stop_at_the_limit() -> None:
    field = b"\x00\x01a\x7f\x81\x07" + b"v" * 1024  # 1 + 1024 + 32 bytes, not indexed
    with pytest.raises(HeaderListTooLarge):  # at the eighth field, not at the index 0
        Decoder(8192).decode(field * 8 + b"\x80")
    with pytest.raises(HPACKDecodeError, match="index 0"):  # 7 fit
        Decoder(8192).decode(field * 7 + b"\x80")


def test_damaged_blocks_decode_as_hpack_decodes_them_or_are_refused() -> None:
    """Valid blocks with a few bytes changed, and random bytes (seeded, 3000 of them): our
    result is hpack's (the same fields, or a refusal where it refuses), and a refusal is always
    an HPACKDecodeError, never another exception."""
    rng = random.Random(11)
    valid = [hpack.Encoder().encode([
        (b":path", b"/x%d" % n), (b"x-a", rng.randbytes(20)),
        (b"authorization", b"Bearer t%d" % n),
        (b":path", b"/x%d" % n)])  # an index into the dynamic table
        for n in range(50)]
    outcomes: dict[str, int] = {}
    for _ in range(3000):
        data = bytearray(rng.choice(valid) if rng.random() < 0.7 else
                         rng.randbytes(rng.randint(0, 40)))
        for _ in range(rng.randint(0, 4) if data else 0):
            data[rng.randrange(len(data))] = rng.randrange(256)
        try:
            ours: object = Decoder(4096).decode(bytes(data))
        except HeaderListTooLarge:
            ours = "too large"
        except HPACKDecodeError:
            ours = "refused"
        try:
            theirs: object = [tuple(f) for f in hpack.Decoder(4096).decode(bytes(data), raw=True)]
        except hpack.OversizedHeaderListError:
            theirs = "too large"
        except hpack.HPACKError:
            theirs = "refused"
        assert ours == theirs, bytes(data).hex()
        outcome = ours if isinstance(ours, str) else "decoded"
        outcomes[outcome] = outcomes.get(outcome, 0) + 1
    assert min(outcomes["decoded"], outcomes["refused"]) > 300, outcomes  # both were tried
