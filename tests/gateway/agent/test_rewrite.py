"""rewrite_request (and rewrite_request_block, the same request as HTTP/2 fields, HPACK-encoded
in one pass): what the agent adds to a parsed head is checked byte-strict, whether the route's
constant parts were checked before or not (the head's own bytes were by the parse)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import hpack
import pytest

from gateway.agent.exchange import Route, rewrite_request, rewrite_request_block
from gateway.agent.pool import UpstreamKey
from gateway.wire.h2upstream import request_fields
from gateway.wire.http1 import RequestHead, parse_request_head
from gateway.wire.identity import REQUEST_ID_HEADER

BOTH = pytest.mark.parametrize("rewrite", [rewrite_request, rewrite_request_block])

HEAD = parse_request_head(b"GET /api/v1/pods HTTP/1.1\r\nHost: hub\r\nAccept: */*\r\n"
                          b"Authorization: Bearer client-token\r\n\r\n")


def route(credential: list[bytes | None], identity: list[tuple[bytes, bytes]],
          authority: bytes = b"10.0.0.1:6443", passthrough: bool = False) -> Route:
    return Route(key=UpstreamKey("10.0.0.1", 6443, "kube", True), ssl_context=lambda: None,
                 authority=authority, label="kube-apiserver",
                 credential=lambda: credential[0], identity_headers=identity,
                 passthrough=passthrough)


def test_rewrite_sends_the_routes_fields_not_the_clients() -> None:
    r = route([b"Bearer agent"], [(b"Impersonate-User", b"alice")])
    out = rewrite_request(HEAD, r, b"rid-1")
    assert out.headers == [(b"Host", b"10.0.0.1:6443"), (b"Accept", b"*/*"),
                           (b"Audit-ID", b"rid-1"), (b"Authorization", b"Bearer agent"),
                           (b"Impersonate-User", b"alice"),
                           (REQUEST_ID_HEADER, b"rid-1")]
    assert out.names == [n.lower() for n, _ in out.headers]


Rewrite = Callable[[RequestHead, Route, bytes], Any]


def authorization(out: RequestHead | bytes) -> bytes | None:
    if isinstance(out, RequestHead):
        return out.get(b"authorization")
    return dict(hpack.Decoder().decode(out, raw=True)).get(b"authorization")


@BOTH
def test_a_rotated_credential_is_checked_on_every_request(rewrite: Rewrite) -> None:
    credential: list[bytes | None] = [b"Bearer good"]
    r = route(credential, [(b"Impersonate-User", b"alice")])
    rewrite(HEAD, r, b"rid-1")  # the route's constant parts are now checked
    credential[0] = b"Bearer bad\r\nImpersonate-User: root"
    with pytest.raises(ValueError):
        rewrite(HEAD, r, b"rid-2")
    credential[0] = b"Bearer good-again"
    assert authorization(rewrite(HEAD, r, b"rid-3")) == b"Bearer good-again"


@BOTH
@pytest.mark.parametrize("audit_id", [b"rid\n1", b"rid\x00"])
def test_the_audit_id_is_checked_on_every_request(rewrite: Rewrite, audit_id: bytes) -> None:
    r = route([b"Bearer agent"], [(b"Impersonate-User", b"alice")])
    rewrite(HEAD, r, b"rid-1")
    with pytest.raises(ValueError):
        rewrite(HEAD, r, audit_id)


@BOTH
def test_identity_and_authority_bytes_are_checked(rewrite: Rewrite) -> None:
    with pytest.raises(ValueError):
        rewrite(HEAD, route([None], [(b"Impersonate-User", b"a\rb")]), b"rid")
    with pytest.raises(ValueError):
        rewrite(HEAD, route([None], [(b"Impersonate User", b"a")]), b"rid")
    with pytest.raises(ValueError):
        rewrite(HEAD, route([None], [], authority=b"host\r\nX: y"), b"rid")


HEADS = [
    HEAD,
    parse_request_head(
        b"POST /api/v1/namespaces/a/pods?dryRun=All HTTP/1.1\r\nhost: hub\r\n"
        b"Content-Length: 2\r\nConnection: keep-alive, close, X-Named, Upgrade-Insecure\r\n"
        b"X-Named: kept (rewrite narrows Connection)\r\nKeep-Alive: 5\r\n"
        b"Proxy-Connection: x\r\nTE: trailers\r\nte: gzip\r\nCookie: a=b\r\n"
        b"Audit-ID: the-clients\r\nImpersonate-User: root\r\nimpersonate_group: x\r\n"
        b"X-Remote-User: root\r\nProxy-Authorization: Basic x\r\n"
        b"Sec-WebSocket-Protocol: base64url.bearer.authorization.k8s.io.dG9r, v5.channel\r\n"
        b"Accept: application/json\r\nAccept: */*\r\nAccept-Encoding: gzip, deflate\r\n"
        b"User-Agent: kubectl/v1.36.0\r\nX-Odd: \x80\xff value\r\n\r\n"),
    parse_request_head(b"HEAD / HTTP/1.1\r\nHost: hub\r\nConnection: close\r\n"
                       b"Sec-WebSocket-Protocol: base64url.bearer.authorization.k8s.io.x\r\n"
                       b"Transfer-Encoding: chunked\r\n\r\n"),
    parse_request_head(b"GET /x HTTP/1.0\r\n\r\n"),
    # Every identity header's "_" alias, and names that start like one but are not.
    parse_request_head(b"GET / HTTP/1.1\r\nHost: hub\r\nX_Remote_Group: g\r\n"
                       b"x_remote_extra_a: b\r\nProxy_Authorization: Basic y\r\n"
                       b"Impersonate_Uid: 1\r\nX-Request: kept\r\nauthorize: kept\r\n"
                       b"proxy-id: kept\r\nimp: kept\r\nx_r: kept\r\n\r\n"),
]
ROUTES = [
    lambda: route([b"Bearer agent"], [(b"Impersonate-User", b"cluster:hub:alice"),
                                      (b"Impersonate-Group", b"cluster:hub:team"),
                                      (b"Impersonate-Extra-Scopes", b"view")]),
    lambda: route([None], [(b"Impersonate-User", b"cluster:hub:alice")]),
    lambda: route([b"Bearer agent"], [], passthrough=True),
    lambda: route([None], []),
]


@pytest.mark.parametrize("head", HEADS)
@pytest.mark.parametrize("make_route", ROUTES)
@pytest.mark.parametrize("audit_id", [b"", b"0a1b"])
def test_the_h2_block_is_the_rewritten_heads_fields(head: RequestHead,
                                                    make_route: Callable[[], Route],
                                                    audit_id: bytes) -> None:
    # One pass from the parsed head to the HPACK block: the same fields, in the same order,
    # as the rewritten head turned into HTTP/2 fields, for every rule either step applies.
    r = make_route()
    for _ in range(2):  # the second time from what the route kept
        expected = request_fields(rewrite_request(head, r, audit_id))
        block = rewrite_request_block(head, r, audit_id)
        assert [tuple(f) for f in hpack.Decoder().decode(block, raw=True)] == expected


def test_upgrades_and_connect_have_no_h2_block() -> None:
    r = route([None], [])
    for raw in (b"GET /ws HTTP/1.1\r\nHost: h\r\nConnection: Upgrade\r\n"
                b"Upgrade: websocket\r\n\r\n", b"CONNECT h:1 HTTP/1.1\r\nHost: h\r\n\r\n"):
        with pytest.raises(ValueError):
            rewrite_request_block(parse_request_head(raw), r)
