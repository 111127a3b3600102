from __future__ import annotations

import base64

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gateway.hub.admission.bearer import BearerError, extract_token
from gateway.wire.websocket import BEARER_PROTOCOL_PREFIX

TOKEN = "eyJhbGciOiJSUzI1NiJ9.eyJzdWIiOiJ4In0.c2ln"
WS = [(b"Upgrade", b"websocket"), (b"Connection", b"Upgrade")]


def proto(token: str) -> bytes:
    return BEARER_PROTOCOL_PREFIX + base64.urlsafe_b64encode(token.encode()).rstrip(b"=")


@pytest.mark.parametrize(
    "value",
    [b"Bearer " + TOKEN.encode(), b"bearer " + TOKEN.encode(), b"BEARER " + TOKEN.encode(),
     b"  Bearer " + TOKEN.encode() + b" \t"],
)
def test_authorization_bearer(value: bytes) -> None:
    result = extract_token([(b"Host", b"gw"), (b"authorization", value)])
    assert result.token == TOKEN
    assert result.source == "authorization"


@pytest.mark.parametrize("value", [b"", b"   "])
def test_empty_authorization_is_no_token(value: bytes) -> None:
    assert extract_token([(b"Authorization", value)]).token is None


def test_no_authorization_is_no_token() -> None:
    result = extract_token([(b"Host", b"gw")])
    assert result.token is None and result.source == ""


@pytest.mark.parametrize(
    "value",
    [
        b"Bearer",
        b"Bearer ",
        b"Bearer  " + TOKEN.encode(),
        b"Bearer a b",
        b"Bearer\t" + TOKEN.encode(),
        b"Basic dXNlcjpwYXNz",
        b"Token abc",
        b"Bearer caf\xc3\xa9",
        b"Bearerabc",
    ],
)
def test_rule1_malformed_authorization_401(value: bytes) -> None:
    with pytest.raises(BearerError) as info:
        extract_token([(b"Authorization", value)])
    assert info.value.status == 401
    secret = value.partition(b" ")[2].strip().decode("latin-1")
    assert not secret or secret not in str(info.value)


def test_two_authorization_headers_401() -> None:
    with pytest.raises(BearerError):
        extract_token([(b"Authorization", b"Bearer a"), (b"authorization", b"Bearer a")])


def test_rule5_error_never_contains_the_token() -> None:
    with pytest.raises(BearerError) as info:
        extract_token([(b"Authorization", b"Bearer secret-token extra")])
    assert "secret-token" not in str(info.value)


def test_websocket_token_subprotocol_accepted_and_removed() -> None:
    headers = [*WS, (b"Sec-WebSocket-Protocol", b"v5.channel.k8s.io, " + proto(TOKEN))]
    result = extract_token(headers)
    assert result.token == TOKEN
    assert result.source == "websocket-protocol"
    assert (b"Sec-WebSocket-Protocol", b"v5.channel.k8s.io") in result.headers
    assert not any(BEARER_PROTOCOL_PREFIX in v for _, v in result.headers)


def test_websocket_token_across_repeated_protocol_headers() -> None:
    headers = [
        *WS,
        (b"Sec-WebSocket-Protocol", proto(TOKEN)),
        (b"Sec-WebSocket-Protocol", b"v4.channel.k8s.io,v5.channel.k8s.io"),
    ]
    result = extract_token(headers)
    assert result.token == TOKEN
    assert [v for n, v in result.headers if n == b"Sec-WebSocket-Protocol"] == [
        b"v4.channel.k8s.io, v5.channel.k8s.io"
    ]


def test_rule2_token_subprotocol_removed_even_without_upgrade() -> None:
    headers = [(b"Sec-WebSocket-Protocol", proto(TOKEN))]
    result = extract_token(headers)
    assert result.token is None  # only a WebSocket upgrade may use it
    assert result.headers == []  # the header was only the token: dropped


@pytest.mark.parametrize("ws_token", ["header-token", ""])
def test_same_token_in_authorization_and_subprotocol_and_subprotocol_removed(ws_token: str
                                                                            ) -> None:
    headers = [
        *WS,
        (b"Authorization", b"Bearer header-token"),
        (b"Sec-WebSocket-Protocol", b"v5.channel.k8s.io," + proto(ws_token)),
    ]
    result = extract_token(headers)
    assert result.token == "header-token"
    assert not any(BEARER_PROTOCOL_PREFIX in v for _, v in result.headers)


@pytest.mark.parametrize(
    "protocols",
    [proto("other"), BEARER_PROTOCOL_PREFIX + b"not*base64",
     proto("header-token") + b"," + proto("x")],
)
def test_different_token_in_authorization_and_subprotocol_is_400(protocols: bytes) -> None:
    headers = [*WS, (b"Authorization", b"Bearer header-token"),
               (b"Sec-WebSocket-Protocol", b"v5.channel.k8s.io," + protocols)]
    with pytest.raises(BearerError) as info:
        extract_token(headers)
    assert info.value.status == 400 and "header-token" not in str(info.value)


def test_two_authorization_headers_are_400() -> None:
    headers = [(b"Authorization", b"Bearer a"), (b"authorization", b"Bearer a")]
    with pytest.raises(BearerError) as info:
        extract_token(headers)
    assert info.value.status == 400


@pytest.mark.parametrize(
    "protocols",
    [
        proto(TOKEN),  # no other subprotocol to echo back
        b"v5.channel.k8s.io, " + proto(TOKEN) + b", " + proto(TOKEN),
        b"v5.channel.k8s.io, " + BEARER_PROTOCOL_PREFIX + b"not*base64",
        b"v5.channel.k8s.io, " + BEARER_PROTOCOL_PREFIX + b"YWJj=",  # padding: RawURLEncoding
        b"v5.channel.k8s.io, " + BEARER_PROTOCOL_PREFIX + b"A",
        b"v5.channel.k8s.io, " + BEARER_PROTOCOL_PREFIX + base64.urlsafe_b64encode(b"\xff\xfe"),
    ],
)
def test_bad_websocket_token_401(protocols: bytes) -> None:
    with pytest.raises(BearerError):
        extract_token([*WS, (b"Sec-WebSocket-Protocol", protocols)])


def test_empty_websocket_token_is_no_token() -> None:
    result = extract_token([*WS, (b"Sec-WebSocket-Protocol", b"v5.channel.k8s.io, " + proto(""))])
    assert result.token is None
    assert result.headers[-1] == (b"Sec-WebSocket-Protocol", b"v5.channel.k8s.io")


def test_not_websocket_upgrade_does_not_use_subprotocol() -> None:
    headers = [
        (b"Upgrade", b"SPDY/3.1"),
        (b"Connection", b"Upgrade"),
        (b"Sec-WebSocket-Protocol", b"v5.channel.k8s.io, " + proto(TOKEN)),
    ]
    assert extract_token(headers).token is None


@settings(max_examples=200, deadline=None)
@given(st.text(alphabet=st.characters(min_codepoint=0x21, max_codepoint=0x7E), min_size=1))
def test_property_any_ascii_token_round_trips_through_subprotocol(token: str) -> None:
    result = extract_token([*WS, (b"Sec-WebSocket-Protocol", b"x, " + proto(token))])
    assert result.token == token
    assert all(proto(token) not in v for _, v in result.headers)
