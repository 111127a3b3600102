"""gateway.wire.hpackfields: HPACK without a dynamic table or Huffman coding. Every block must
decode with a standard decoder (hpack's) to exactly the fields given, credentials never indexed.
Pure: fields in, bytes out."""

from __future__ import annotations

import hpack

from gateway.wire.hpackfields import FieldEncoder, NamedField, encode_field, encode_fields

REQUEST = [(b":method", b"GET"), (b":scheme", b"https"), (b":authority", b"10.0.0.1:6443"),
           (b":path", b"/api/v1/namespaces/team/pods?limit=500"),
           (b"accept", b"application/json"), (b"user-agent", b"kubectl/v1.36.0"),
           (b"x-odd", bytes(range(0x20, 0x100))),
           (b"authorization", b"Bearer agent-token"),
           (b"impersonate-user", b"cluster:hub:alice"),
           (b"impersonate-group", b"cluster:hub:team")]


def decoded(decoder: hpack.Decoder, block: bytes) -> list[tuple[bytes, bytes]]:
    return [tuple(f) for f in decoder.decode(block, raw=True)]  # type: ignore[misc]


def test_field_encoder_blocks_decode_to_the_fields_with_no_dynamic_table() -> None:
    encoder, decoder = FieldEncoder(), hpack.Decoder()
    first = encoder.encode(REQUEST)
    assert first[:1] == b"\x20"  # dynamic table size update to 0, once
    for value in (b"application/json", b"kubectl/v1.36.0", b"cluster:hub:alice"):
        assert value in first  # plain literals: nothing to Huffman-code or decode
    assert decoded(decoder, first) == REQUEST
    for _ in range(3):  # again, from the cache: the same bytes, and still decodable
        again = encoder.encode(REQUEST)
        assert again == first[1:]
        assert decoded(decoder, again) == REQUEST
    assert decoder.header_table_size == 0 and not decoder.header_table.dynamic_entries
    encoder.header_table_size = 65536  # what h2 sets on the server's SETTINGS: nothing changes
    assert encoder.encode(REQUEST) == first[1:]


def test_field_encoder_sends_credentials_and_identity_never_indexed() -> None:
    encoder, decoder = FieldEncoder(), hpack.Decoder()
    fields = decoder.decode(encoder.encode([*REQUEST, (b"proxy-authorization", b"Basic x"),
                                            (b"cookie", b"a=b"),
                                            (b"impersonate-extra-scopes", b"view")]), raw=True)
    never = [f[0] for f in fields if isinstance(f, hpack.NeverIndexedHeaderTuple)]
    assert never == [b"authorization", b"impersonate-user", b"impersonate-group",
                     b"proxy-authorization", b"cookie", b"impersonate-extra-scopes"]


def test_field_encoder_keeps_no_old_credential() -> None:
    encoder = FieldEncoder()
    encoder.encode([(b"authorization", b"Bearer old-token"), (b"accept", b"*/*")])
    block = encoder.encode([(b"authorization", b"Bearer new-token"), (b"accept", b"*/*")])
    assert b"Bearer new-token" in block  # sent as it is, not Huffman-coded
    assert "old-token" not in repr(encoder._cache) + repr(encoder._secret)


def test_field_encoder_cache_is_bounded() -> None:
    encoder, decoder = FieldEncoder(), hpack.Decoder()
    for i in range(3 * FieldEncoder.MAX_CACHED):
        field = (b"content-length", b"%d" % i)
        assert decoded(decoder, encoder.encode([field])) == [field]
        assert len(encoder._cache) <= FieldEncoder.MAX_CACHED


def test_a_retaining_encoder_keeps_only_the_apiservers_own_response_fields() -> None:
    # A Service's response through proxy-service (or a pod's through the apiserver's proxy
    # subresource) may carry a session in a header of its own: encoded, never kept.
    FieldEncoder._cache.clear()
    encoder, decoder = FieldEncoder(), hpack.Decoder()
    fields = [(b":status", b"200"), (b"content-type", b"application/json"),
              (b"x-session-token", b"sess-5ecret-value"), (b"location", b"/login?t=5ecret")]
    for _ in range(2):
        assert decoded(decoder, encoder.encode(fields)) == fields
    kept = repr(FieldEncoder._cache)
    assert "5ecret" not in kept and "x-session-token" not in kept
    assert (b"content-type", b"application/json") in FieldEncoder._cache


def test_field_encoder_name_cache_is_bounded_and_holds_no_value() -> None:
    # What a field's encoding takes from its name is kept per name (a request's audit-id is
    # new every time, its name never): bounded like the fields, and never a value, secret or not.
    encoder, decoder = FieldEncoder(), hpack.Decoder()
    for i in range(3 * FieldEncoder.MAX_CACHED):
        fields = [(b"x-name-%d" % i, b"v"), (b"authorization", b"Bearer t%d" % i),
                  (b"impersonate-user", b"u%d" % i), (b":status", b"200")]
        assert decoded(decoder, encoder.encode(fields)) == fields
        assert len(encoder._names) <= FieldEncoder.MAX_CACHED
    assert b"Bearer" not in repr(encoder._names).encode()


def test_field_encoder_response_set_cookie_is_never_indexed_nor_cached() -> None:
    encoder, decoder = FieldEncoder(), hpack.Decoder()
    block = encoder.encode([(b":status", b"200"), (b"set-cookie", b"session=s3cret")])
    fields = decoder.decode(block, raw=True)
    assert [f[0] for f in fields if isinstance(f, hpack.NeverIndexedHeaderTuple)] == \
        [b"set-cookie"]
    assert b"s3cret" not in b"".join(encoder._cache.values())


def test_an_encoder_that_retains_nothing_keeps_no_field_a_client_chose() -> None:
    # The agent's requests carry header names and values a client sent through the gateway
    # (one may hold a secret): encoded for the request, kept nowhere after it (issue 26).
    encoder, decoder = FieldEncoder(retain=False), hpack.Decoder()
    fields = [*REQUEST, (b"x-client-secret-name-7f3a", b"s3cret-client-value-7f3a")]
    assert decoded(decoder, encoder.encode(fields)) == fields
    assert decoded(decoder, encoder.block(encode_fields(fields))) == fields
    kept = repr(FieldEncoder._cache) + repr(FieldEncoder._names) + repr(encoder._secret)
    assert "7f3a" not in kept and "agent-token" not in kept


def test_encode_field_is_a_standard_field_never_indexing_secrets() -> None:
    decoder = hpack.Decoder()
    fields = [*REQUEST, (b":method", b"PATCH"), (b":path", b"/"), (b"cookie", b"a=b")]
    out = decoder.decode(b"".join(encode_field(*f) for f in fields), raw=True)
    assert [tuple(f) for f in out] == fields
    assert [f[0] for f in out if isinstance(f, hpack.NeverIndexedHeaderTuple)] == \
        [b"authorization", b"impersonate-user", b"impersonate-group", b"cookie"]


def test_named_field_encodes_as_encode_field_does() -> None:
    """A constant name's part made once changes no byte: static full matches, static names,
    literal names, never-indexed ``impersonate-*``, values past one length byte."""
    long_value = b"v" * 300
    for name in (b":method", b"accept", b"audit-id", b"impersonate-extra-hubproxy.dev%2frequest-id",
                 b"authorization", b"x-" + b"n" * 200):
        field = NamedField(name)
        for value in (b"", b"GET", b"POST", b"*/*", b"5eed", long_value):
            assert field(value) == encode_field(name, value), (name, value)
    decoder = hpack.Decoder()
    out = decoder.decode(NamedField(b"impersonate-extra-x")(b"5eed"), raw=True)
    assert [tuple(f) for f in out] == [(b"impersonate-extra-x", b"5eed")]
    assert isinstance(out[0], hpack.NeverIndexedHeaderTuple)
