"""DESIGN §6, gateway side: each test tries to break one rule through the real front door and
asserts on the exact bytes the (fake) agent received, the logs, the metrics and the errors."""

from __future__ import annotations

import asyncio
import base64
import json
import logging

import pytest

from gateway.hub.config import FrontDoorLimits
from tests.gateway.hub.test_frontdoor_harness import (
    HUB_TOKEN,
    OTHER_TOKEN,
    Harness,
    get,
    parse_raw,
    read_response,
    running,
    tls,  # noqa: F401
)
from tests.gateway.hub.test_frontdoor_harness import gw as gw

pytestmark = pytest.mark.timeout(30)


def all_forwarded(h: Harness, cluster: str = "c1") -> bytes:
    return b"".join(bytes(s.received) + s.metadata for s in h.streams(cluster))


# --- rule 1: no request reaches a managed cluster without a hub-verified identity -------------


@pytest.mark.parametrize("token", [None, "", "not-a-hub-token", "system:anonymous"])
async def test_rule1_no_request_without_hub_verified_identity(gw: Harness, token) -> None:
    raw = get("/c1/api/v1/secrets", token=token or None, close=True)
    status, _, _ = parse_raw(await gw.exchange(raw))
    assert status == 401
    assert gw.streams() == []


async def test_rule1_every_forwarded_stream_carries_an_identity(gw: Harness) -> None:
    for token in (HUB_TOKEN, OTHER_TOKEN):
        await gw.exchange(get("/c1/api", token=token, close=True))
    for stream in gw.streams():
        meta = json.loads(stream.metadata)
        assert meta["user"].startswith("cluster:hub:") and "passthrough" not in meta


async def test_rule1_hub_errors_never_become_passthrough(tls) -> None:  # noqa: F811
    async with running(tls, token_passthrough=True) as h:
        h.connect_cluster("c1")
        h.reviewer.down = True
        status, _, _ = parse_raw(await h.exchange(get("/c1/api", token="x", close=True)))
        assert status == 503 and h.streams() == []


# --- rule 2: client Impersonate-*, Authorization and control headers never cross --------------


@pytest.mark.parametrize(
    "header",
    [
        "Impersonate-User: system:admin", "impersonate-group: system:masters",
        "IMPERSONATE-UID: 1", "Impersonate-Extra-scopes: all", "Impersonate_User: admin",
        "ImpersonateFoo: x", "X-Hubproxy-Identity: admin",
    ],
)
async def test_rule2_client_impersonation_and_control_headers_refused(gw: Harness, header: str
                                                                      ) -> None:
    status, _, body = parse_raw(await gw.exchange(get("/c1/api", extra=header + "\r\n",
                                                      close=True)))
    assert status == 403
    assert json.loads(body)["reason"] == "Forbidden"
    assert gw.streams() == []


async def test_rule2_authorization_and_forwarding_headers_never_cross(gw: Harness) -> None:
    extra = ("X-Remote-User: admin\r\nX-Remote-Group: system:masters\r\n"
             "X-Forwarded-For: 10.9.9.9\r\nForwarded: for=10.9.9.9\r\nProxy-Authorization: x\r\n"
             "Cookie: a=b\r\n")
    status, _, _ = parse_raw(await gw.exchange(get("/c1/api", extra=extra, close=True)))
    assert status == 200
    sent = all_forwarded(gw).lower()
    for needle in (b"authorization", b"x-remote-", b"10.9.9.9", HUB_TOKEN.lower().encode()):
        assert needle not in sent, needle
    assert b"x-forwarded-for: 127.0.0.1" in sent


@pytest.mark.parametrize("where", ["query", "path", "header"])
async def test_rule2_a_token_copied_outside_authorization_never_crosses(gw: Harness, where: str
                                                                       ) -> None:
    """A client that also puts its hub token in the query (``?access_token=``), the path or
    another header would hand it to the managed cluster: refused, nothing forwarded."""
    target, extra = {
        "query": (f"/c1/api/v1/pods?access_token={HUB_TOKEN}", ""),
        "path": (f"/c1/api/v1/namespaces/{HUB_TOKEN}/pods", ""),
        "header": ("/c1/api/v1/pods", f"X-Api-Key: {HUB_TOKEN}\r\n"),
    }[where]
    status, _, body = parse_raw(await gw.exchange(get(target, extra=extra, close=True)))
    assert status == 400
    assert "Authorization" in json.loads(body)["message"]
    assert HUB_TOKEN.encode() not in body
    assert gw.streams() == []
    # The same request without the copy goes through.
    status, _, _ = parse_raw(await gw.exchange(get("/c1/api/v1/pods", close=True)))
    assert status == 200 and len(gw.streams()) == 1


async def test_rule2_connection_cannot_nominate_security_headers(gw: Harness) -> None:
    raw = get("/c1/api", extra="Connection: Authorization\r\n", close=True)
    status, _, _ = parse_raw(await gw.exchange(raw))
    assert status == 400 and gw.streams() == []


async def test_rule2_websocket_token_protocol_never_crosses(gw: Harness) -> None:
    enc = base64.urlsafe_b64encode(HUB_TOKEN.encode()).rstrip(b"=").decode()
    extra = ("Upgrade: websocket\r\nConnection: Upgrade\r\nSec-WebSocket-Version: 13\r\n"
             "Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n"
             f"Sec-WebSocket-Protocol: base64url.bearer.authorization.k8s.io.{enc},"
             " v5.channel.k8s.io\r\n")
    raw = get("/c1/api/v1/namespaces/d/pods/p/exec?command=ls", token=None, extra=extra)
    await gw.exchange(raw)  # the echo agent answers 200: relayed, then closed
    sent = all_forwarded(gw)
    assert sent and enc.encode() not in sent and HUB_TOKEN.encode() not in sent
    assert b"base64url.bearer" not in sent


async def test_rule2_smuggled_second_request_does_not_reach_the_stream(gw: Harness) -> None:
    smuggled = b"GET /c1/api/v1/secrets HTTP/1.1\r\nHost: h\r\n\r\n"
    body = b"0\r\n\r\n" + smuggled  # chunked body ends early; the rest is a new request
    raw = (b"POST /c1/api HTTP/1.1\r\nHost: h\r\nAuthorization: Bearer " + HUB_TOKEN.encode()
           + b"\r\nTransfer-Encoding: chunked\r\n\r\n" + body)
    reader, writer = await gw.open()
    writer.write(raw)
    assert (await read_response(reader))[0] == 200
    assert (await read_response(reader))[0] == 401  # the smuggled one, unauthenticated
    writer.close()
    assert len(gw.streams()) == 1
    assert not bytes(gw.streams()[0].received).endswith(smuggled)


# --- rule 3: hub identities are prefixed ------------------------------------------------------


async def test_rule3_hub_identities_cannot_become_reserved_names(gw: Harness) -> None:
    await gw.exchange(get("/c1/api", token=OTHER_TOKEN, close=True))  # bob in system:masters
    meta = json.loads(gw.streams()[0].metadata)
    assert meta["user"] == "cluster:hub:bob"
    assert "system:masters" not in meta["groups"]
    assert all(g.startswith("cluster:hub:") for g in meta["groups"])


# --- rule 5: tokens never appear in logs, metrics, errors or audit records --------------------


async def test_rule5_tokens_never_in_logs_metrics_errors(tls, caplog) -> None:  # noqa: F811
    caplog.set_level(logging.DEBUG)
    secret_query = "eyJhbGciOiJSUzI1NiJ9.eyJzdWIiOiJ4In0.c2lnbmF0dXJl"
    async with running(tls) as h:
        h.gateway.audit_trail.lines = True
        h.connect_cluster("c1")
        responses = [
            await h.exchange(get(f"/c1/api?access_token={secret_query}", close=True)),
            await h.exchange(get("/c1/api", token="bad-" + HUB_TOKEN, close=True)),
            await h.exchange(get("/c1/api", extra="Impersonate-User: x\r\n", close=True)),
            await h.exchange(get("/nowhere/api", close=True)),
        ]
        h.reviewer.down = True
        responses.append(await h.exchange(get("/c1/api", token="other-" + HUB_TOKEN,
                                               close=True)))
        metrics = h.gateway.metrics.render().decode()
    text = caplog.text + metrics
    errors = b"".join(r for r in responses[1:])
    assert "request_id" in caplog.text  # audit lines were written
    for secret in (HUB_TOKEN, secret_query):
        assert secret not in text
        assert secret.encode() not in errors


# --- rule 6: fail closed ----------------------------------------------------------------------


async def test_rule6_hub_unavailable_fails_closed_with_503(gw: Harness) -> None:
    gw.reviewer.down = True
    status, headers, _ = parse_raw(await gw.exchange(get("/c1/api", token="fresh", close=True)))
    assert status == 503 and headers["retry-after"]
    assert gw.streams() == []


async def test_rule6_a_hub_outage_serves_only_what_the_hub_confirmed(tls) -> None:  # noqa: F811
    async with running(tls, token_cache_ttl=0.3, hub_outage_grace=30.0) as h:
        h.connect_cluster("c1")
        assert parse_raw(await h.exchange(get("/c1/api", close=True)))[0] == 200
        h.reviewer.down = True
        await asyncio.sleep(0.4)  # the cached review has expired: the hub is asked, and fails
        assert parse_raw(await h.exchange(get("/c1/api", close=True)))[0] == 200
        status, headers, _ = parse_raw(await h.exchange(get("/c1/api", token="fresh",
                                                            close=True)))
        assert status == 503 and int(headers["retry-after"]) >= 1
        assert "hubproxy_hub_outage_answers_total 1" in h.gateway.metrics.render().decode()
    async with running(tls, token_cache_ttl=0.3, hub_outage_grace=0.0) as h:
        h.connect_cluster("c1")
        assert parse_raw(await h.exchange(get("/c1/api", close=True)))[0] == 200
        h.reviewer.down = True
        await asyncio.sleep(0.4)
        assert parse_raw(await h.exchange(get("/c1/api", close=True)))[0] == 503


async def test_rule6_malformed_response_is_not_relayed(gw: Harness) -> None:
    async def evil(stream) -> None:
        await stream.request()
        stream.send(b"HTTP/1.1 200 OK\r\nContent-Length: 1\r\nContent-Length: 2\r\n\r\nab")
        stream.send_eof()

    gw.connect_cluster("evil", evil)
    status, _, body = parse_raw(await gw.exchange(get("/evil/api", close=True)))
    assert status == 502 and json.loads(body)["kind"] == "Status"


# --- rule 7: bounded everything ---------------------------------------------------------------


async def test_rule7_connection_limit(tls) -> None:  # noqa: F811
    async with running(tls, limits=FrontDoorLimits(max_connections=2)) as h:
        h.connect_cluster("c1")
        held = [await h.open() for _ in range(2)]
        await asyncio.sleep(0.1)
        reader, writer = await h.open()
        async with asyncio.timeout(5):
            assert await reader.read(-1) == b""  # refused at once
        writer.close()
        for _, w in held:
            w.close()


async def test_rule7_oversize_head_refused_without_buffering_it(tls) -> None:  # noqa: F811
    from gateway.wire.http1 import Limits

    limits = FrontDoorLimits(head=Limits(max_head_bytes=4096, max_request_line=1024))
    async with running(tls, limits=limits) as h:
        h.connect_cluster("c1")
        data = await h.exchange(b"GET /c1/api HTTP/1.1\r\nHost: h\r\nX: " + b"a" * 1_000_000)
        assert parse_raw(data)[0] == 431


async def test_rule7_slow_client_does_not_stall_others(tls) -> None:  # noqa: F811
    async with running(tls, limits=FrontDoorLimits(header_timeout=0.5)) as h:
        h.connect_cluster("c1")
        slow_reader, slow_writer = await h.open()
        slow_writer.write(b"GET /c1/api HTTP/1.1\r\nHo")  # and nothing more
        status, _, _ = parse_raw(await h.exchange(get("/c1/api", close=True)))
        assert status == 200
        async with asyncio.timeout(5):
            assert parse_raw(await slow_reader.read(-1))[0] == 408
        slow_writer.close()


async def test_rule5_audit_lines_for_requests_and_streams(gw: Harness, caplog) -> None:
    caplog.set_level(logging.INFO, logger="hubproxy.audit")
    gw.gateway.audit_trail.lines = True
    await gw.exchange(get("/c1/api/v1/pods?watch=1&token=abc", close=True))
    events = [json.loads(r.getMessage()) for r in caplog.records if r.name == "hubproxy.audit"]
    assert [e["event"] for e in events] == ["stream_start", "stream_end"]
    end = events[-1]
    assert end["user"] == "system:serviceaccount:team:alice" and end["cluster"] == "c1"
    assert end["status"] == 200 and end["bytes_out"] > 0 and "duration_ms" in end
    assert end["path"] == "/c1/api/v1/pods?watch=1&token=REDACTED"


async def test_rule2_hub_token_for_another_audience_is_never_passed_through(tls) -> None:  # noqa: F811
    async with running(tls, token_passthrough=True) as h:
        h.connect_cluster("c1")
        h.gateway.authenticator.audiences = ("hubproxy",)

        async def wrong_audience(token, audiences):
            return {"authenticated": True, "error": "", "audiences": ["someone-else"],
                    "user": {"username": "alice"}}

        h.reviewer.review = wrong_audience
        status, _, _ = parse_raw(await h.exchange(get("/c1/api", close=True)))
        assert status == 401 and h.streams() == []
