"""The join and renew bodies: what each path must and must not carry."""

from __future__ import annotations

import pytest

from gateway.wire.join import (
    JOIN,
    RENEW,
    CertificateRequest,
    JoinBodyError,
    decode_answer,
    decode_request,
    encode_answer,
    encode_request,
)


def test_round_trip_and_refusals() -> None:
    req = CertificateRequest(b"PEM", "tok")
    assert decode_request(JOIN, encode_request(req)) == req
    assert decode_request(RENEW, encode_request(CertificateRequest(b"PEM"))).token is None
    for path, body in ((JOIN, b'{"csr": "x"}'), (RENEW, b'{"csr": "x", "token": "t"}'),
                       (JOIN, b"[]"), (JOIN, b"{"), (RENEW, b'{"csr": 1}')):
        with pytest.raises(JoinBodyError):
            decode_request(path, body)
    assert decode_answer(200, encode_answer(b"CERT")) == b"CERT"
    with pytest.raises(JoinBodyError, match="403: nope"):
        decode_answer(403, encode_answer(error="nope"))
    with pytest.raises(JoinBodyError, match="502"):
        decode_answer(502, b"<html>")
