"""rewrite_request: what the agent adds to a parsed head is checked byte-strict, whether the
route's constant parts were checked before or not (the head's own bytes were by the parse)."""

from __future__ import annotations

import pytest

from gateway.agent.exchange import Route, rewrite_request
from gateway.agent.pool import UpstreamKey
from gateway.wire.http1 import parse_request_head
from gateway.wire.identity import REQUEST_ID_HEADER

HEAD = parse_request_head(b"GET /api/v1/pods HTTP/1.1\r\nHost: hub\r\nAccept: */*\r\n"
                          b"Authorization: Bearer client-token\r\n\r\n")


def route(credential: list[bytes | None], identity: list[tuple[bytes, bytes]],
          authority: bytes = b"10.0.0.1:6443") -> Route:
    return Route(key=UpstreamKey("10.0.0.1", 6443, "kube", True), ssl_context=lambda: None,
                 authority=authority, label="kube-apiserver",
                 credential=lambda: credential[0], identity_headers=identity)


def test_rewrite_sends_the_routes_fields_not_the_clients() -> None:
    r = route([b"Bearer agent"], [(b"Impersonate-User", b"alice")])
    out = rewrite_request(HEAD, r, b"rid-1")
    assert out.headers == [(b"Host", b"10.0.0.1:6443"), (b"Accept", b"*/*"),
                           (b"Audit-ID", b"rid-1"), (b"Authorization", b"Bearer agent"),
                           (b"Impersonate-User", b"alice"),
                           (REQUEST_ID_HEADER, b"rid-1")]
    assert out.names == [n.lower() for n, _ in out.headers]


def test_a_rotated_credential_is_checked_on_every_request() -> None:
    credential: list[bytes | None] = [b"Bearer good"]
    r = route(credential, [(b"Impersonate-User", b"alice")])
    rewrite_request(HEAD, r, b"rid-1")  # the route's constant parts are now checked
    credential[0] = b"Bearer bad\r\nImpersonate-User: root"
    with pytest.raises(ValueError):
        rewrite_request(HEAD, r, b"rid-2")
    credential[0] = b"Bearer good-again"
    assert rewrite_request(HEAD, r, b"rid-3").get(b"authorization") == b"Bearer good-again"


@pytest.mark.parametrize("audit_id", [b"rid\n1", b"rid\x00"])
def test_the_audit_id_is_checked_on_every_request(audit_id: bytes) -> None:
    r = route([b"Bearer agent"], [(b"Impersonate-User", b"alice")])
    rewrite_request(HEAD, r, b"rid-1")
    with pytest.raises(ValueError):
        rewrite_request(HEAD, r, audit_id)


def test_identity_and_authority_bytes_are_checked() -> None:
    with pytest.raises(ValueError):
        rewrite_request(HEAD, route([None], [(b"Impersonate-User", b"a\rb")]), b"rid")
    with pytest.raises(ValueError):
        rewrite_request(HEAD, route([None], [(b"Impersonate User", b"a")]), b"rid")
    with pytest.raises(ValueError):
        rewrite_request(HEAD, route([None], [], authority=b"host\r\nX: y"), b"rid")
