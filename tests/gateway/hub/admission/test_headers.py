from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gateway.hub.admission.headers import (
    HOP_BY_HOP,
    HeaderRefused,
    check_client_headers,
    is_upgrade,
    rewrite_request_headers,
)
from gateway.wire.identity import strip_identity_headers
from gateway.wire.websocket import BEARER_PROTOCOL_PREFIX

BASE = [(b"Host", b"gw.example:9092"), (b"Accept", b"application/json")]


def rewrite(*extra: tuple[bytes, bytes], client_ip: str = "10.1.2.3") -> list[tuple[bytes, bytes]]:
    return rewrite_request_headers([*BASE, *extra], client_ip=client_ip, host=b"gw.example:9092")


def names(headers: list[tuple[bytes, bytes]]) -> list[bytes]:
    return [n.lower() for n, _ in headers]


def refused(*extra: tuple[bytes, bytes], status: int = 403) -> HeaderRefused:
    with pytest.raises(HeaderRefused) as info:
        rewrite(*extra)
    assert info.value.status == status
    return info.value


def test_plain_request_keeps_order_and_adds_forwarding() -> None:
    out = rewrite((b"User-Agent", b"kubectl"), (b"X-Custom", b"1"))
    assert out == [
        (b"Host", b"gw.example:9092"),
        (b"Accept", b"application/json"),
        (b"User-Agent", b"kubectl"),
        (b"X-Custom", b"1"),
        (b"X-Forwarded-For", b"10.1.2.3"),
        (b"X-Forwarded-Proto", b"https"),
        (b"X-Forwarded-Host", b"gw.example:9092"),
        (b"Forwarded", b'for=10.1.2.3;proto=https;host="gw.example:9092"'),
    ]


@pytest.mark.parametrize("name", [b"Cookie", b"cookie", b"COOKIE", b"Audit-ID", b"audit-id"])
def test_rule2_cookie_and_audit_id_never_go_to_the_apiserver(name: bytes) -> None:
    """Issue 24: kube-apiserver reads no cookie on API paths, and a dashboard may keep a hub
    token in one; the client's Audit-ID is replaced by the gateway's request id (the agent)."""
    out = rewrite((name, b"hubsession=s3cret"), (b"X-Custom", b"1"))
    assert name.lower() not in names(out)
    assert not any(b"s3cret" in v for _, v in out)
    assert b"x-custom" in names(out)


def test_a_service_gets_its_cookies_and_audit_id() -> None:
    """The /proxy-service/ form reaches an application: its cookies are its own."""
    out = rewrite_request_headers([*BASE, (b"Cookie", b"app=1; theme=dark"), (b"Audit-ID", b"x")],
                                  client_ip="10.1.2.3", host=b"gw", to_service=True)
    assert (b"Cookie", b"app=1; theme=dark") in out and (b"Audit-ID", b"x") in out


def test_ipv6_client() -> None:
    out = dict(rewrite(client_ip="::1"))
    assert out[b"X-Forwarded-For"] == b"::1"
    assert out[b"Forwarded"].startswith(b'for="[::1]";')


def test_rule2_authorization_removed() -> None:
    out = rewrite((b"Authorization", b"Bearer hub-token"), (b"Proxy-Authorization", b"Basic x"))
    assert b"authorization" not in names(out)
    assert b"proxy-authorization" not in names(out)
    assert not any(b"hub-token" in v for _, v in out)


@pytest.mark.parametrize(
    "name",
    [
        b"Impersonate-User",
        b"impersonate-group",
        b"IMPERSONATE-UID",
        b"Impersonate-Extra-scopes",
        b"Impersonate_User",
        b"impersonate",
        b"ImpersonateFoo",
        b"iMpErSoNaTe-uSeR",
    ],
)
def test_rule2_client_impersonate_header_refused_any_case(name: bytes) -> None:
    err = refused((name, b"system:admin"))
    assert "impersonat" in str(err).lower()
    assert "system:admin" not in str(err)


@pytest.mark.parametrize("name", [b"X-Hubproxy-Cluster", b"x-hubproxy-identity", b"X-HUBPROXY-"])
def test_rule2_agent_control_headers_refused(name: bytes) -> None:
    assert "reserved" in str(refused((name, b"x")))


@pytest.mark.parametrize(
    "name",
    [
        b"X_Remote_User",
        b"x-remote_group",
        b"X_Forwarded_For",
        b"Content_Length",
        b"Transfer_Encoding",
        b"Proxy_Authorization",
        b"Authorization_",
        b"_Authorization",
        b"X_Hubproxy_Cluster",
        b"X_Real_Ip",
    ],
)
def test_rule2_underscore_alias_of_sensitive_header_refused(name: bytes) -> None:
    refused((name, b"admin"))


def test_harmless_underscore_names_pass() -> None:
    out = rewrite((b"X_Custom_Thing", b"1"))
    assert (b"X_Custom_Thing", b"1") in out


@pytest.mark.parametrize(
    "nominated",
    [
        b"Authorization",
        b"Host",
        b"Content-Length",
        b"Transfer-Encoding",
        b"Impersonate-User",
        b"X-Forwarded-For",
        b"Forwarded",
        b"X-Remote-User",
        b"X-Hubproxy-Cluster",
        b"Sec-WebSocket-Protocol",
        b"Sec-WebSocket-Key",
        b"Cookie",
        b"keep-alive, Authorization",
        b"X_Forwarded_For",
    ],
)
def test_rule2_connection_nominating_security_header_refused(nominated: bytes) -> None:
    refused((b"Connection", nominated), status=400)


def test_hop_by_hop_and_nominated_headers_removed() -> None:
    out = rewrite(
        (b"Connection", b"keep-alive, X-Trace-Hop"),
        (b"Keep-Alive", b"timeout=5"),
        (b"Proxy-Connection", b"keep-alive"),
        (b"TE", b"trailers"),
        (b"Trailer", b"X-Checksum"),
        (b"X-Trace-Hop", b"1"),
        (b"Upgrade", b"websocket"),  # no Connection: upgrade -> not an upgrade
    )
    for name in (*HOP_BY_HOP, b"x-trace-hop", b"upgrade"):
        assert name not in names(out)


def test_transfer_encoding_and_content_length_kept_for_verbatim_body() -> None:
    out = rewrite((b"Transfer-Encoding", b"chunked"))
    assert (b"Transfer-Encoding", b"chunked") in out
    out = rewrite((b"Content-Length", b"12"))
    assert (b"Content-Length", b"12") in out


def test_client_forwarding_and_remote_headers_replaced() -> None:
    out = rewrite(
        (b"X-Forwarded-For", b"1.1.1.1"),
        (b"x-forwarded-host", b"evil"),
        (b"X-Forwarded-Proto", b"http"),
        (b"X-Forwarded-Prefix", b"/x"),
        (b"Forwarded", b"for=1.1.1.1"),
        (b"X-Real-IP", b"1.1.1.1"),
        (b"X-Remote-User", b"admin"),
        (b"X-Remote-Group", b"system:masters"),
        (b"X-Remote-Extra-Scopes", b"all"),
    )
    assert [v for n, v in out if n.lower() == b"x-forwarded-for"] == [b"10.1.2.3"]
    assert [v for n, v in out if n.lower() == b"x-forwarded-host"] == [b"gw.example:9092"]
    assert [v for n, v in out if n.lower() == b"x-forwarded-proto"] == [b"https"]
    assert len([n for n in names(out) if n == b"forwarded"]) == 1
    assert not any(n.startswith(b"x-remote-") or n == b"x-real-ip" for n in names(out))
    assert b"x-forwarded-prefix" not in names(out)
    assert not any(b"1.1.1.1" in v or b"evil" in v for _, v in out)


def test_websocket_upgrade_kept() -> None:
    out = rewrite(
        (b"Connection", b"Upgrade"),
        (b"Upgrade", b"websocket"),
        (b"Sec-WebSocket-Key", b"dGhlIHNhbXBsZSBub25jZQ=="),
        (b"Sec-WebSocket-Version", b"13"),
        (b"Sec-WebSocket-Protocol", b"v5.channel.k8s.io, " + BEARER_PROTOCOL_PREFIX + b"YWJj"),
    )
    assert (b"Upgrade", b"websocket") in out
    assert [v for n, v in out if n.lower() == b"connection"] == [b"Upgrade"]
    assert (b"Sec-WebSocket-Protocol", b"v5.channel.k8s.io") in out
    assert not any(BEARER_PROTOCOL_PREFIX in v for _, v in out)
    assert is_upgrade(out) == b"websocket"


def test_spdy_upgrade_kept() -> None:
    out = rewrite((b"Connection", b"keep-alive, Upgrade"), (b"Upgrade", b"SPDY/3.1"))
    assert is_upgrade(out) == b"SPDY/3.1"


def test_is_upgrade() -> None:
    assert is_upgrade([(b"Connection", b"upgrade"), (b"Upgrade", b"websocket")]) == b"websocket"
    assert is_upgrade([(b"Upgrade", b"websocket")]) is None
    assert is_upgrade([(b"Connection", b"close, Upgrade")]) is None


def test_check_client_headers_passes_a_normal_kubectl_request() -> None:
    check_client_headers(
        [*BASE, (b"Authorization", b"Bearer t"), (b"Kubectl-Command", b"kubectl get")]
    )


def test_strip_identity_headers_for_the_agent() -> None:
    headers = [
        (b"Host", b"x"),
        (b"Authorization", b"Bearer t"),
        (b"proxy-authorization", b"Basic t"),
        (b"Impersonate-User", b"admin"),
        (b"impersonate_group", b"system:masters"),
        (b"Impersonate-Extra-x", b"y"),
        (b"X-Remote-User", b"admin"),
        (b"X_Remote_Group", b"g"),
        (b"Accept", b"*/*"),
    ]
    assert strip_identity_headers(headers) == [(b"Host", b"x"), (b"Accept", b"*/*")]


_NAME = st.text(alphabet="abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ-_", min_size=1,
                max_size=30).map(str.encode)


@settings(max_examples=400, deadline=None)
@given(st.lists(st.tuples(_NAME, st.binary(max_size=10)), max_size=8))
def test_property_nothing_sensitive_ever_crosses(headers: list[tuple[bytes, bytes]]) -> None:
    try:
        out = rewrite_request_headers(headers, client_ip="10.0.0.1", host=b"gw")
    except HeaderRefused:
        return
    for name, _ in out:
        norm = name.lower().replace(b"_", b"-")
        assert not norm.startswith(b"impersonate")
        assert not norm.startswith(b"x-hubproxy-")
        assert not norm.startswith(b"x-remote-")
        assert norm not in (b"authorization", b"proxy-authorization")


def test_rule2_pure_pipeline_parse_extract_rewrite_serialize() -> None:
    from gateway.hub.admission.bearer import extract_token
    from gateway.hub.admission.routing import route
    from gateway.wire.http1 import parse_request_head, serialize_request_head

    raw = (
        b"GET /c1/api/v1/namespaces/default/pods/p/exec?command=sh&stdin=true HTTP/1.1\r\n"
        b"Host: gw.example:9092\r\n"
        b"Connection: Upgrade\r\n"
        b"Upgrade: websocket\r\n"
        b"Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n"
        b"Sec-WebSocket-Version: 13\r\n"
        b"Sec-WebSocket-Protocol: v5.channel.k8s.io, " + BEARER_PROTOCOL_PREFIX
        + b"aHViLXRva2Vu\r\n"
        b"X-Forwarded-For: 6.6.6.6\r\n"
        b"\r\n"
    )
    head = parse_request_head(raw)
    cluster_route = route(head.target)
    credential = extract_token(head.headers)
    assert credential.token == "hub-token"
    out = rewrite_request_headers(credential.headers, client_ip="192.0.2.7", host=head.host or b"")
    forwarded = serialize_request_head(head.method, cluster_route.upstream_target, out)
    again = parse_request_head(forwarded)
    assert again.target == b"/api/v1/namespaces/default/pods/p/exec?command=sh&stdin=true"
    assert again.upgrade == b"websocket"
    assert again.get(b"sec-websocket-protocol") == b"v5.channel.k8s.io"
    assert again.get_all(b"x-forwarded-for") == [b"192.0.2.7"]
    assert b"aHViLXRva2Vu" not in forwarded and b"hub-token" not in forwarded
