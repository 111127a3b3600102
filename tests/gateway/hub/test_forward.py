"""Forwarding decisions and the stream relay: refusals, cluster lookup, OPEN errors, upgrades,
back-pressure, cancellation, passthrough."""

from __future__ import annotations

import asyncio
import base64
import json

import pytest

from gateway.hub.admission.authorize import NotAuthorized
from tests.gateway.hub.test_frontdoor_harness import (
    HUB_TOKEN,
    MANAGED_TOKEN,
    OTHER_TOKEN,
    FakeSession,
    FakeStream,
    Harness,
    echo_agent,
    get,
    parse_raw,
    read_response,
    running,
    status_of,
    tls,  # noqa: F401
)
from tests.gateway.hub.test_frontdoor_harness import gw as gw
from tests.support import tasks_started
from tunnel.errors import OpenErrorCode, OpenRefused, ResetCode, SessionClosed, StreamReset
from tunnel.targets import ServiceTarget

pytestmark = pytest.mark.timeout(30)


@pytest.mark.parametrize(
    "path",
    [
        "/c1/api/v1/../secrets", "/c1/api/v1/%2e%2E/secrets", "/c1/api/./v1",
        "/c%2f1/api", "/c1/api\\v1", "/c1/api%5cv1", "/C1/api", "/-c1/api", "/c1/a%00b",
        "//api/v1",
    ],
)
async def test_routing_refusals_are_400(gw: Harness, path: str) -> None:
    status, _obj = status_of(await gw.exchange(get(path, close=True)))
    assert status == 400
    assert gw.streams() == []


async def test_service_form_opens_a_service_target(gw: Harness) -> None:
    data = await gw.exchange(get(
        "/c1/api/v1/namespaces/default/services/https:web:8443/proxy-service/x/y?q=1",
        close=True))
    status, _, body = parse_raw(data)
    assert status == 200
    assert json.loads(body)["target"] == "/x/y?q=1"
    assert gw.streams()[0].target == ServiceTarget("default", "web", 8443, "https")


@pytest.mark.parametrize(
    ("auth", "status"),
    [
        ("Basic dXNlcjpwYXNz", 401),
        ("Bearer", 401),
        ("Bearer  two spaces", 401),
        ("Bearer unknown-token", 401),
    ],
)
async def test_bearer_refusals(gw: Harness, auth: str, status: int) -> None:
    raw = f"GET /c1/api HTTP/1.1\r\nHost: h\r\nAuthorization: {auth}\r\n" \
          "Connection: close\r\n\r\n".encode()
    got, obj = status_of(await gw.exchange(raw))
    assert got == status and obj["reason"] == "Unauthorized"


async def test_two_authorization_headers_400(gw: Harness) -> None:
    raw = get("/c1/api", extra=f"Authorization: Bearer {HUB_TOKEN}\r\n", close=True)
    assert status_of(await gw.exchange(raw))[0] == 400
    assert gw.streams() == []


async def test_no_token_401_and_connection_kept(gw: Harness) -> None:
    reader, writer = await gw.open()
    writer.write(get("/c1/api", token=None))
    status, headers, _ = await read_response(reader)
    assert status == 401 and "bearer" in headers["www-authenticate"].lower()
    writer.write(get("/c1/api"))
    assert (await read_response(reader))[0] == 200
    writer.close()


async def test_bearer_scheme_case_insensitive(gw: Harness) -> None:
    raw = f"GET /c1/api HTTP/1.1\r\nHost: h\r\nAuthorization: bEaReR {HUB_TOKEN}\r\n" \
          "Connection: close\r\n\r\n".encode()
    assert parse_raw(await gw.exchange(raw))[0] == 200


def ws_request(path: str, token: str | None, protocols: str = "v5.channel.k8s.io") -> bytes:
    protos = protocols
    if token is not None:
        enc = base64.urlsafe_b64encode(token.encode()).rstrip(b"=").decode()
        protos = f"base64url.bearer.authorization.k8s.io.{enc}, {protocols}"
    return (f"GET {path} HTTP/1.1\r\nHost: h\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
            f"Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n"
            f"Sec-WebSocket-Protocol: {protos}\r\n\r\n").encode()


async def upgrade_agent(stream: FakeStream) -> None:
    _head, _ = await stream.request()
    stream.send(b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\n"
                b"Connection: Upgrade\r\nSec-WebSocket-Protocol: v5.channel.k8s.io\r\n\r\nhello")
    # Echo raw bytes until the gateway half-closes, then close our side.
    seen = len(stream.received)
    while True:
        await stream.wait(lambda mark=seen: len(stream.received) > mark or stream.eof
                          or stream.closed)
        if len(stream.received) > seen:
            stream.send(b"echo:" + bytes(stream.received[seen:]))
            seen = len(stream.received)
        if stream.eof or stream.closed:
            break
    stream.send_eof()


EXEC = "/c1/api/v1/namespaces/default/pods/web/exec?command=sh&stdin=true"


async def test_websocket_upgrade_spliced_after_101_with_subprotocol_token(tls) -> None:  # noqa: F811
    async with running(tls) as h:
        h.connect_cluster("c1", upgrade_agent)
        reader, writer = await h.open()
        writer.write(ws_request(EXEC, HUB_TOKEN))
        async with asyncio.timeout(5):
            head = await reader.readuntil(b"\r\n\r\n")
            assert head.startswith(b"HTTP/1.1 101")
            assert await reader.readexactly(5) == b"hello"
            writer.write(b"ping")
            assert await reader.readexactly(9) == b"echo:ping"
        stream = h.streams()[0]
        sent = bytes(stream.received)
        assert HUB_TOKEN.encode() not in sent
        assert b"base64url.bearer" not in sent
        assert b"Sec-WebSocket-Protocol: v5.channel.k8s.io" in sent
        assert b"Upgrade: websocket" in sent
        writer.close()
        await stream.wait(lambda: stream.closed)
        assert stream.closed


async def test_upgrade_refused_for_non_streaming_path(gw: Harness) -> None:
    raw = ws_request("/c1/api/v1/namespaces/default/pods", HUB_TOKEN)
    assert status_of(await gw.exchange(raw))[0] == 400
    assert gw.streams() == []


async def test_upgrade_refused_for_unknown_protocol(gw: Harness) -> None:
    raw = get(EXEC, extra="Upgrade: h2c\r\nConnection: Upgrade\r\n")
    assert status_of(await gw.exchange(raw))[0] == 400


async def test_upgrade_answered_without_101_relays_error_and_closes(gw: Harness) -> None:
    async def no_agent(stream: FakeStream) -> None:
        await stream.request()
        body = b'{"kind":"Status","code":403}'
        stream.send(b"HTTP/1.1 403 Forbidden\r\nContent-Length: %d\r\n\r\n" % len(body) + body)
        stream.send_eof()

    gw.connect_cluster("c2", no_agent)
    raw = get(EXEC.replace("/c1/", "/c2/"), extra="Upgrade: SPDY/3.1\r\nConnection: Upgrade\r\n"
              "X-Stream-Protocol-Version: v4.channel.k8s.io\r\n")
    data = await gw.exchange(raw)  # read to EOF: the gateway closed the connection
    assert parse_raw(data)[0] == 403
    stream = gw.streams("c2")[0]
    assert stream.closed


async def test_cluster_not_connected_503_and_unknown_404(gw: Harness) -> None:
    assert status_of(await gw.exchange(get("/nowhere/api", close=True)))[0] == 404
    session = gw.sessions["c1"]
    gw.registry.remove("c1", session)  # c1 was seen: now "not connected"
    status, obj = status_of(await gw.exchange(get("/c1/api", close=True)))
    assert status == 503 and obj["message"] == 'cluster "c1" is not connected'


async def test_startup_grace_answers_503_for_unseen_cluster(tls) -> None:  # noqa: F811
    async with running(tls, unknown_cluster_grace=60.0) as h:
        status, _ = status_of(await h.exchange(get("/later/api", close=True)))
        assert status == 503


async def test_cluster_lookup_only_after_authentication(gw: Harness) -> None:
    # An anonymous caller cannot tell connected from unknown clusters.
    a = status_of(await gw.exchange(get("/c1/api", token="bad", close=True)))[0]
    b = status_of(await gw.exchange(get("/nowhere/api", token="bad", close=True)))[0]
    assert a == b == 401


async def test_hub_down_is_503_not_401(gw: Harness) -> None:
    gw.reviewer.down = True
    status, obj = status_of(await gw.exchange(get("/c1/api", token="never-cached", close=True)))
    assert status == 503 and obj["reason"] == "ServiceUnavailable"


async def test_hub_authorization_denied_403(tls) -> None:  # noqa: F811
    class Deny:
        async def authorize(self, user, cluster):
            raise NotAuthorized(f'user "{user.username}" cannot use cluster "{cluster}"')

    async with running(tls, authorizer=Deny()) as h:
        h.connect_cluster("c1")
        status, obj = status_of(await h.exchange(get("/c1/api", close=True)))
        assert status == 403 and "cannot use cluster" in obj["message"]
        assert h.streams() == []


@pytest.mark.parametrize(
    ("code", "status"),
    [
        (OpenErrorCode.DENIED, 403), (OpenErrorCode.NO_IDENTITY, 403),
        (OpenErrorCode.UNREACHABLE, 502), (OpenErrorCode.TIMEOUT, 504),
        (OpenErrorCode.OVERLOAD, 429), (OpenErrorCode.SHUTTING_DOWN, 503),
    ],
)
async def test_open_refusals_map_to_status(gw: Harness, code: OpenErrorCode, status: int
                                           ) -> None:
    async def refusing(stream: FakeStream) -> None:
        stream.fail(OpenRefused(code, "dial tcp 10.0.0.7:6443: secret internal detail"))

    gw.connect_cluster("c3", refusing)
    got, obj = status_of(await gw.exchange(get("/c3/api", close=True)))
    assert got == status
    assert "10.0.0.7" not in obj["message"]  # internal addresses never reach clients


async def test_open_refusal_keeps_connection(gw: Harness) -> None:
    async def refusing(stream: FakeStream) -> None:
        stream.fail(OpenRefused(OpenErrorCode.UNREACHABLE))

    gw.connect_cluster("c3", refusing)
    reader, writer = await gw.open()
    writer.write(get("/c3/api"))
    assert (await read_response(reader))[0] == 502
    writer.write(get("/c1/api"))
    assert (await read_response(reader))[0] == 200
    writer.close()


async def test_session_lost_before_head_503_after_head_close(gw: Harness) -> None:
    async def dies_early(stream: FakeStream) -> None:
        await stream.request()
        stream.fail(SessionClosed("gone"))

    async def dies_late(stream: FakeStream) -> None:
        await stream.request()
        stream.send(b"HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\npartial")
        await asyncio.sleep(0.05)
        stream.fail(StreamReset(ResetCode.INTERNAL))

    gw.connect_cluster("early", dies_early)
    gw.connect_cluster("late", dies_late)
    assert status_of(await gw.exchange(get("/early/api", close=True)))[0] == 503
    data = await gw.exchange(get("/late/api"))  # no Connection: close -- the gateway closes
    assert data.startswith(b"HTTP/1.1 200 OK") and data.endswith(b"partial")


async def test_truncated_response_closes_client_connection(gw: Harness) -> None:
    async def short(stream: FakeStream) -> None:
        await stream.request()
        stream.send(b"HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\nabc")
        stream.send_eof()

    gw.connect_cluster("c4", short)
    data = await gw.exchange(get("/c4/api"))
    assert data.endswith(b"abc")


async def test_malformed_response_502(gw: Harness) -> None:
    async def garbage(stream: FakeStream) -> None:
        await stream.request()
        stream.send(b"NOT HTTP\r\n\r\n")

    gw.connect_cluster("c4", garbage)
    assert status_of(await gw.exchange(get("/c4/api", close=True)))[0] == 502


async def test_response_header_timeout_504(tls) -> None:  # noqa: F811
    from gateway.hub.config import FrontDoorLimits

    async def silent(stream: FakeStream) -> None:
        await stream.request()
        await asyncio.sleep(30)

    async with running(tls, limits=FrontDoorLimits(response_header_timeout=0.3)) as h:
        h.connect_cluster("c1", silent)
        assert status_of(await h.exchange(get("/c1/api", close=True)))[0] == 504
        assert h.streams()[0].reset_code == ResetCode.CANCEL


async def test_overload_429(tls) -> None:  # noqa: F811
    from gateway.hub.config import FrontDoorLimits

    hold = asyncio.Event()

    async def slow(stream: FakeStream) -> None:
        await stream.request()
        await hold.wait()
        stream.send(b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n")
        stream.send_eof()

    async with running(tls, limits=FrontDoorLimits(max_inflight=1)) as h:
        h.connect_cluster("c1", slow)
        reader, writer = await h.open()
        writer.write(get("/c1/first"))
        for _ in range(200):
            if h.streams() and h.streams()[0].eof:
                break
            await asyncio.sleep(0.01)
        status, obj = status_of(await h.exchange(get("/c1/second", close=True)))
        assert status == 429 and obj["reason"] == "TooManyRequests"
        hold.set()
        assert (await read_response(reader))[0] == 200
        writer.close()


async def test_client_disconnect_resets_stream(gw: Harness) -> None:
    async def watch(stream: FakeStream) -> None:
        await stream.request()
        stream.send(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n1\r\na\r\n")
        await stream.wait(lambda: stream.closed, timeout=10)

    gw.connect_cluster("w", watch)
    reader, writer = await gw.open()
    writer.write(get("/w/api/v1/pods?watch=true"))
    async with asyncio.timeout(5):
        await reader.readuntil(b"1\r\na\r\n")
    writer.close()
    stream = gw.streams("w")[0]
    await stream.wait(lambda: stream.closed)
    assert stream.reset_code == ResetCode.CANCEL


async def test_backpressure_slow_client_pauses_stream(gw: Harness) -> None:
    chunk = b"x" * 262144
    count = 128  # 32 MiB: more than loopback socket buffers hold
    sent = 0

    async def firehose(stream: FakeStream) -> None:
        nonlocal sent
        await stream.request()
        stream.send(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n" % (count * len(chunk)))
        for _ in range(count):
            while stream.paused:
                stream.changed.clear()
                await stream.changed.wait()
            stream.send(chunk)
            sent += len(chunk)
            await asyncio.sleep(0)
        stream.send_eof()

    gw.connect_cluster("big", firehose)
    reader, writer = await gw.open()
    writer.write(get("/big/api", close=True))
    await asyncio.sleep(0.5)  # the client reads nothing
    assert sent < count * len(chunk)  # the stream was paused by the client's transport
    assert gw.streams("big")[0].paused
    received = 0
    async with asyncio.timeout(20):
        while data := await reader.read(1 << 20):
            received += len(data)
    assert sent == count * len(chunk) and received > sent
    writer.close()


async def test_backpressure_stream_window_pauses_client_reading(gw: Harness) -> None:
    reader, writer = await gw.open()
    writer.write(b"POST /c1/api HTTP/1.1\r\nHost: h\r\nAuthorization: Bearer " + HUB_TOKEN.encode()
                 + b"\r\nContent-Length: 10\r\n\r\nabc")
    stream = None
    for _ in range(100):
        if gw.streams():
            stream = gw.streams()[0]
            break
        await asyncio.sleep(0.01)
    assert stream is not None
    (door,) = gw.gateway.connections
    stream.protocol.pause_writing()
    assert "stream" in door._paused
    stream.protocol.resume_writing()
    assert not door._paused
    writer.write(b"defghij")
    assert (await read_response(reader))[0] == 200
    writer.close()


async def test_token_passthrough_forwards_rejected_token_without_identity(tls) -> None:  # noqa: F811
    async with running(tls, token_passthrough=True) as h:
        h.connect_cluster("c1")
        status, _, body = parse_raw(await h.exchange(get("/c1/api", token=MANAGED_TOKEN,
                                                         close=True)))
        assert status == 200
        seen = json.loads(body)
        assert seen["metadata"]["passthrough"] is True
        assert seen["metadata"]["user"] == "" and seen["metadata"]["groups"] == []
        assert ["Authorization", f"Bearer {MANAGED_TOKEN}"] in seen["headers"]
        # A hub token is still never passed through: it is verified and impersonated.
        status, _, body = parse_raw(await h.exchange(get("/c1/api", close=True)))
        seen = json.loads(body)
        assert "passthrough" not in seen["metadata"]
        assert HUB_TOKEN not in json.dumps(seen)
        # Hub down: never passthrough (fail closed).
        h.reviewer.down = True
        status, _, _ = parse_raw(await h.exchange(get("/c1/api", token="other-managed",
                                                      close=True)))
        assert status == 503


async def test_prefixing_keeps_hub_users_off_reserved_groups(gw: Harness) -> None:
    _, _, body = parse_raw(await gw.exchange(get("/c1/api", token=OTHER_TOKEN, close=True)))
    meta = json.loads(body)["metadata"]
    assert meta["user"] == "cluster:hub:bob"
    assert meta["groups"] == ["cluster:hub:system:masters"]


def test_identity_cache_metadata_equals_the_slow_path() -> None:
    from gateway.hub.admission.auth import UserInfo
    from gateway.hub.admission.identity import IdentityCache, map_identity
    from gateway.wire.identity import Identity

    user = UserInfo("system:serviceaccount:ns:sa", "u1", ("g1", "system:authenticated"),
                    {"authentication.kubernetes.io/pod-name": ("p",)})
    cache = IdentityCache(max_entries=2)
    for rid in ("0123abcd", "ffff0000"):
        fast = cache.metadata(user, "cluster:hub:", rid)
        slow = map_identity(user, prefix="cluster:hub:", request_id=rid).to_metadata()
        assert fast == slow
        assert Identity.from_metadata(fast).request_id == rid
    other = UserInfo("bob")
    assert Identity.from_metadata(cache.metadata(other, "cluster:hub:", "01")).user == \
        "cluster:hub:bob"
    assert len(cache._entries) == 2


@pytest.mark.parametrize(
    ("protocols", "upgrade", "expected"),
    [
        # the token protocol alone: no Kubernetes stream protocol offered (and the server could
        # not echo a protocol back), refused before the token is looked at
        ("", True, 400),
        ("v5.channel.k8s.io", False, 401),  # not a WebSocket upgrade: the protocol is no token
    ],
)
async def test_websocket_token_rules(gw: Harness, protocols: str, upgrade: bool, expected: int
                                     ) -> None:
    enc = base64.urlsafe_b64encode(HUB_TOKEN.encode()).rstrip(b"=").decode()
    value = ", ".join(p for p in (f"base64url.bearer.authorization.k8s.io.{enc}", protocols) if p)
    extra = f"Sec-WebSocket-Protocol: {value}\r\n"
    if upgrade:
        extra += "Upgrade: websocket\r\nConnection: Upgrade\r\n"
    data = await gw.exchange(get(EXEC, token=None, extra=extra, close=not upgrade))
    assert status_of(data)[0] == expected
    assert gw.streams() == []


async def test_malformed_chunked_response_body_closes_the_client(gw: Harness) -> None:
    async def broken(stream: FakeStream) -> None:
        await stream.request()
        stream.send(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n")
        await asyncio.sleep(0.05)
        stream.send(b"zz\r\nsmuggled\r\n")

    gw.connect_cluster("c5", broken)
    data = await gw.exchange(get("/c5/api"))  # the gateway closes; nothing after abc
    assert data.endswith(b"3\r\nabc\r\n")
    assert gw.streams("c5")[0].reset_code is not None


async def test_cached_admission_decides_like_the_reviewed_one(tls) -> None:  # noqa: F811
    from gateway.hub.admission.authorize import SarAuthorizer

    decisions: list[tuple[str, str]] = []

    async def review(user, cluster) -> bool:
        decisions.append((user.username, cluster))
        return cluster == "c1"

    authorizer = SarAuthorizer(None, ttl=60, review=review)
    async with running(tls, authorizer=authorizer) as h:
        h.connect_cluster("c1")
        h.connect_cluster("c2")
        with tasks_started() as reviewed:
            first = json.loads(parse_raw(await h.exchange(get("/c1/api/v1/pods",
                                                              close=True)))[2])
        assert any("_admit_and_seat" in name for name in reviewed)  # the awaiting path
        # Same token and cluster again: answered from the caches, without a task or a review.
        with tasks_started() as cached:
            second = json.loads(parse_raw(await h.exchange(get("/c1/api/v1/pods",
                                                               close=True)))[2])
        assert not [name for name in cached if "admit" in name], cached
        assert h.reviewer.seen.count(HUB_TOKEN) == 1 and decisions == [(decisions[0][0], "c1")]
        for meta in (first["metadata"], second["metadata"]):
            meta.pop("rid")
        assert first == second
        # A cached denial is never taken for an allow by the synchronous path.
        for _ in range(2):
            status, _obj = status_of(await h.exchange(get("/c2/api", close=True)))
            assert status == 403
        assert decisions.count((decisions[0][0], "c2")) == 1
        assert len(h.streams("c2")) == 0


async def test_a_watch_keeps_only_what_its_audit_line_needs(tls, caplog) -> None:  # noqa: F811
    import logging

    from gateway.ops import audit

    async def watch(stream: FakeStream) -> None:
        await stream.request()
        stream.send(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
                    b"Transfer-Encoding: chunked\r\n\r\n1\r\na\r\n")
        await stream.wait(lambda: stream.closed, timeout=10)

    caplog.set_level(logging.INFO, logger=audit.AUDIT_LOGGER)  # before the gateway starts
    async with running(tls) as gw:
        gw.connect_cluster("w", watch)
        reader, writer = await gw.open()
        writer.write(get("/w/api/v1/pods?watch=true", extra="X-Padding: " + "p" * 2000 + "\r\n"))
        async with asyncio.timeout(5):
            await reader.readuntil(b"1\r\na\r\n")
        [door] = [d for d in gw.gateway.connections if d.exchange is not None]
        exchange = door.exchange
        # Hours-long streams hold no header lists, forwarded head or identity metadata...
        assert door.head.headers == [] and exchange.response.headers == []
        assert exchange.admitted.head == b"" and exchange.admitted.metadata == b""
        # ...and still end with a complete audit line.
        writer.close()
        stream = gw.streams("w")[0]
        await stream.wait(lambda: stream.closed)
        async with asyncio.timeout(5):
            while not any('"stream_end"' in r.getMessage() for r in caplog.records):
                await asyncio.sleep(0.02)
        [end] = [json.loads(r.getMessage()) for r in caplog.records
                 if '"stream_end"' in r.getMessage()]
        assert end["method"] == "GET" and end["path"] == "/w/api/v1/pods?watch=true"
        assert end["cluster"] == "w" and end["status"] == 200


async def test_an_open_a_draining_agent_refuses_is_sent_on_another_session(gw: Harness) -> None:
    """The agent drains a session (a duplicate, or one its certificate rotation replaced) just
    as a request's OPEN crosses: the OPEN never reached the apiserver, so the gateway sends it
    again on the cluster's other session instead of answering 503."""
    draining = FakeSession(echo_agent)

    async def refuses_while_draining(stream: FakeStream) -> None:
        draining.draining = True  # its DRAIN arrives first, then the refusal
        stream.fail(OpenRefused(OpenErrorCode.SHUTTING_DOWN, "draining"))

    draining.agent = refuses_while_draining
    gw.registry.add("c2", draining)
    serving = FakeSession(echo_agent)
    gw.registry.add("c2", serving)
    body = b'{"kind":"ConfigMap"}'
    request = (b"POST /c2/api/v1/namespaces/x/configmaps HTTP/1.1\r\nHost: h\r\n"
               b"Authorization: Bearer " + HUB_TOKEN.encode() + b"\r\n"
               b"Content-Length: %d\r\nConnection: close\r\n\r\n" % len(body) + body)
    got, _, answer = parse_raw(await gw.exchange(request))
    assert got == 200
    assert json.loads(answer)["body"] == body.decode()  # the echo of the request, in full
    assert len(draining.streams) == 1 and len(serving.streams) == 1
    assert bytes(serving.streams[0].received) == bytes(draining.streams[0].received)


async def test_a_request_whose_body_was_still_coming_is_not_sent_again(gw: Harness) -> None:
    """Body bytes that followed the OPEN were lost with the refused stream: no replay, 503."""
    draining = FakeSession(echo_agent)

    async def refuses_after_the_body_started(stream: FakeStream) -> None:
        await stream.wait(lambda: stream.received.endswith(b"0123456789"), 5)
        draining.draining = True
        stream.fail(OpenRefused(OpenErrorCode.SHUTTING_DOWN, "draining"))

    draining.agent = refuses_after_the_body_started
    gw.registry.add("c2", draining)
    serving = FakeSession(echo_agent)
    gw.registry.add("c2", serving)
    reader, writer = await gw.open()
    writer.write(b"POST /c2/api/v1/namespaces/x/configmaps HTTP/1.1\r\nHost: h\r\n"
                 b"Authorization: Bearer " + HUB_TOKEN.encode() + b"\r\n"
                 b"Content-Length: 10\r\n\r\n")
    await asyncio.sleep(0.2)
    writer.write(b"0123456789")
    assert (await read_response(reader))[0] == 503
    assert serving.streams == []
    writer.close()


async def test_a_request_complete_in_the_open_carries_its_fin_there(gw: Harness) -> None:
    """The agent learns the request is complete from the OPEN itself (one tunnel write); a
    body still on its way keeps the stream open until it has all been sent."""
    assert parse_raw(await gw.exchange(get("/c1/api", close=True)))[0] == 200
    whole = gw.streams()[0]
    assert whole.fin_in_open and whole.eof
    reader, writer = await gw.open()
    writer.write(b"POST /c1/api HTTP/1.1\r\nHost: h\r\nAuthorization: Bearer " + HUB_TOKEN.encode()
                 + b"\r\nContent-Length: 10\r\nConnection: close\r\n\r\nabc")
    for _ in range(100):
        if len(gw.streams()) == 2:
            break
        await asyncio.sleep(0.01)
    partial = gw.streams()[1]
    assert not partial.fin_in_open and not partial.eof
    writer.write(b"defghij")
    assert (await read_response(reader))[0] == 200
    assert partial.eof and bytes(partial.received).endswith(b"\r\n\r\nabcdefghij")
    writer.close()
