"""The agent's per-stream exchange against a real TLS HTTP server, driven by a fake stream."""

from __future__ import annotations

import asyncio
import base64
import json
import os
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

from gateway.agent.agent import Agent
from gateway.agent.kubeapi import from_kubeconfig
from gateway.agent.pool import UpstreamPool
from tests.gateway.agent.conftest import FakeStream, Upstream
from tests.support import free_port
from tunnel.connection import OpenRequest
from tunnel.errors import OpenErrorCode, OpenRefused, ResetCode
from tunnel.targets import KubeAPITarget, ServiceTarget, TCPTarget

AGENT_TOKEN = "agent-token-abc"
HUB_TOKEN = "hub-token-must-not-cross"


@dataclass
class Resolved:
    host_ip: str
    port: int
    server_hostname: str | None
    tls: bool


class FakePolicy:
    """Allows the kube API and the services given; the real TargetPolicy is tested by tunnel."""

    def __init__(self, kube: tuple[str, int], services: dict[tuple[str, str, int], int]) -> None:
        self.kube = kube
        self.services = services

    def resolve_now(self, target: Any) -> None:
        return None  # always the awaited path

    async def resolve(self, target: Any) -> Resolved:
        if isinstance(target, KubeAPITarget):
            return Resolved(self.kube[0], self.kube[1], None, True)
        if isinstance(target, ServiceTarget):
            key = (target.namespace, target.name, target.port)
            if key not in self.services:
                raise OpenRefused(OpenErrorCode.DENIED, "service not allow-listed")
            return Resolved("127.0.0.1", self.services[key], "localhost", target.scheme == "https")
        raise OpenRefused(OpenErrorCode.DENIED, "not allowed")


def write_kubeconfig(path: Path, up: Upstream, token_file: Path) -> Path:
    doc = {
        "apiVersion": "v1", "kind": "Config", "current-context": "c",
        "clusters": [{"name": "k", "cluster": {"server": f"https://{up.host}:{up.port}",
                                               "certificate-authority": up.ca_file}}],
        "users": [{"name": "u", "user": {"tokenFile": str(token_file)}}],
        "contexts": [{"name": "c", "context": {"cluster": "k", "user": "u"}}],
    }
    path.write_text(yaml.safe_dump(doc))
    return path


@pytest.fixture
def agent(upstream: Upstream, tmp_path: Path) -> Agent:
    token_file = tmp_path / "token"
    token_file.write_text(AGENT_TOKEN + "\n")
    access = from_kubeconfig(str(write_kubeconfig(tmp_path / "kc", upstream, token_file)))
    policy = FakePolicy((upstream.host, upstream.port), {("demo", "web", 80): upstream.port})
    return Agent(cluster="c1", policy=policy, kube=access, pool=UpstreamPool(),
                 service_ca=upstream.ca_file)


def identity_metadata(user: str = "cluster:hub:system:serviceaccount:demo:demo") -> bytes:
    from gateway.wire.identity import Identity

    return Identity(user=user, groups=("cluster:hub:system:serviceaccounts",), uid="u-1",
                    extra={}, request_id="req-1").to_metadata()


def open_stream(agent: Agent, target: Any, metadata: bytes, data: bytes = b"") -> FakeStream:
    protocol = agent.on_open(OpenRequest(7, target, metadata))
    assert protocol is not None
    stream = FakeStream(protocol, target, metadata)
    if data:
        stream.send(data)
    return stream


def get(path: str, *extra: str) -> bytes:
    lines = [f"GET {path} HTTP/1.1", "Host: gateway.example:9092", *extra, "", ""]
    return "\r\n".join(lines).encode()


def seen_headers(entry: dict[str, Any]) -> list[tuple[str, str]]:
    return [(k.lower(), v) for k, v in entry["headers"]]


async def test_identity_and_credential_are_the_agents_never_the_stream_bytes(
    agent: Agent, upstream: Upstream
) -> None:
    request = get(
        "/echo/api/v1/pods?labelSelector=a%3Db",
        f"Authorization: Bearer {HUB_TOKEN}",
        "Impersonate-User: system:admin",
        "impersonate-group: system:masters",
        "X-Remote-User: admin",
        "X_Remote_Group: system:masters",
        "Proxy-Authorization: Basic Zm9vOmJhcg==",
        "Connection: keep-alive, Impersonate-User, Authorization",
        "Accept: application/json",
    )
    stream = open_stream(agent, KubeAPITarget(), identity_metadata(), request)
    stream.send_eof()
    await stream.wait_done()
    assert stream.accepted and stream.eof
    status, _, body = stream.response()
    assert status == 200
    entry = json.loads(body)
    headers = seen_headers(entry)
    assert entry["path"] == "/echo/api/v1/pods?labelSelector=a%3Db"
    assert ("authorization", f"Bearer {AGENT_TOKEN}") in headers
    assert [v for k, v in headers if k == "authorization"] == [f"Bearer {AGENT_TOKEN}"]
    assert [v for k, v in headers if k == "impersonate-user"] == [
        "cluster:hub:system:serviceaccount:demo:demo"
    ]
    assert [v for k, v in headers if k == "impersonate-group"] == [
        "cluster:hub:system:serviceaccounts"
    ]
    assert ("impersonate-uid", "u-1") in headers
    assert not any(k.startswith("x-remote-") or k == "proxy-authorization" for k, _ in headers)
    assert HUB_TOKEN not in json.dumps(entry)
    assert ("host", f"{upstream.host}:{upstream.port}") in headers
    # identity goes last
    assert headers[-1][0].startswith("impersonate-")
    assert ("accept", "application/json") in headers
    assert [v for k, v in headers if k == "connection"] == ["keep-alive"]


@pytest.mark.parametrize("metadata", [b"", b"{}", b"not json", b'{"user": ""}'])
async def test_rule1_no_identity_refused_at_agent(agent: Agent, upstream: Upstream,
                                                  metadata: bytes) -> None:
    stream = open_stream(agent, KubeAPITarget(), metadata, get("/echo/x"))
    await stream.wait_done()
    assert stream.refused is not None
    assert stream.refused[0] == OpenErrorCode.NO_IDENTITY
    assert not stream.accepted
    await asyncio.sleep(0.05)
    assert upstream.seen == []


async def test_keep_alive_connection_is_reused(agent: Agent, upstream: Upstream) -> None:
    for i in range(3):
        stream = open_stream(agent, KubeAPITarget(), identity_metadata(), get(f"/echo/{i}"))
        stream.send_eof()
        await stream.wait_done()
        assert stream.response()[0] == 200
    assert agent.pool.dials == 1
    assert len(upstream.peers) == 1
    assert agent.stats.by_outcome.get("complete") == 3


async def test_chunked_request_body_relayed(agent: Agent, upstream: Upstream) -> None:
    head = (b"POST /echo/create HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n"
            b"Content-Type: application/json\r\n\r\n")
    stream = open_stream(agent, KubeAPITarget(), identity_metadata(), head + b"5\r\nhel")
    stream.send(b"lo\r\n6\r\n world\r\n0\r\n\r\n")
    stream.send_eof()
    await stream.wait_done()
    status, _, body = stream.response()
    assert status == 200
    assert json.loads(body)["body"] == "hello world"


async def test_content_length_body_split_across_frames(agent: Agent) -> None:
    head = b"PUT /echo/x HTTP/1.1\r\nHost: x\r\nContent-Length: 10\r\n\r\n"
    stream = open_stream(agent, KubeAPITarget(), identity_metadata(), head)
    for piece in (b"01234", b"567", b"89"):
        await asyncio.sleep(0.01)
        stream.send(piece)
    stream.send_eof()
    await stream.wait_done()
    assert json.loads(stream.response()[2])["body"] == "0123456789"


async def test_bytes_after_request_body_reset_not_smuggled(agent: Agent,
                                                         upstream: Upstream) -> None:
    smuggled = get("/echo/smuggled", "Impersonate-User: system:admin")
    head = b"POST /echo/a HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\n\r\nok"
    stream = open_stream(agent, KubeAPITarget(), identity_metadata(), head + smuggled)
    await stream.wait_done()
    assert stream.reset_code == ResetCode.PROTOCOL
    await asyncio.sleep(0.1)
    assert all("smuggled" not in e["path"] for e in upstream.seen)


async def test_client_reset_cancels_watch_upstream(agent: Agent, upstream: Upstream) -> None:
    stream = open_stream(agent, KubeAPITarget(), identity_metadata(), get("/watch"))
    stream.send_eof()
    await stream.wait(lambda: stream.received.count(b"ADDED") >= 3)
    assert not stream.eof
    stream.client_reset()
    async with asyncio.timeout(5):
        while not upstream.disconnects:
            await asyncio.sleep(0.02)
    assert upstream.disconnects == ["/watch"]
    assert agent.pool.in_use == 0


async def test_upstream_unreachable_is_typed_refusal(tmp_path: Path, upstream: Upstream) -> None:
    token_file = tmp_path / "token"
    token_file.write_text(AGENT_TOKEN)
    access = from_kubeconfig(str(write_kubeconfig(tmp_path / "kc", upstream, token_file)))
    dead = free_port()
    agent = Agent(cluster="c1", policy=FakePolicy(("127.0.0.1", dead), {}), kube=access)
    stream = open_stream(agent, KubeAPITarget(), identity_metadata(), get("/x"))
    await stream.wait_done()
    assert stream.refused is not None and stream.refused[0] == OpenErrorCode.UNREACHABLE


async def test_token_file_rotation_is_picked_up(agent: Agent, upstream: Upstream,
                                                tmp_path: Path) -> None:
    assert agent.kube is not None and agent.kube.token is not None
    agent.kube.token.check_interval = 0.0
    (tmp_path / "token.new").write_text("rotated-token\n")
    os.replace(tmp_path / "token.new", tmp_path / "token")
    stream = open_stream(agent, KubeAPITarget(), identity_metadata(), get("/echo/r"))
    stream.send_eof()
    await stream.wait_done()
    headers = seen_headers(json.loads(stream.response()[2]))
    assert ("authorization", "Bearer rotated-token") in headers


async def test_service_gets_no_credential_and_no_identity(agent: Agent,
                                                          upstream: Upstream) -> None:
    request = get("/echo/svc", f"Authorization: Bearer {HUB_TOKEN}", "Impersonate-User: x")
    stream = open_stream(agent, ServiceTarget("demo", "web", 80, "https"), b"", request)
    stream.send_eof()
    await stream.wait_done()
    status, _, body = stream.response()
    assert status == 200
    headers = seen_headers(json.loads(body))
    assert not any(k in ("authorization",) or k.startswith("impersonate") for k, _ in headers)
    assert ("host", "localhost:80") in headers


async def test_service_not_allow_listed_denied(agent: Agent) -> None:
    stream = open_stream(agent, ServiceTarget("kube-system", "secret", 443), b"", get("/"))
    await stream.wait_done()
    assert stream.refused is not None and stream.refused[0] == OpenErrorCode.DENIED


async def test_tcp_target_denied_by_policy(agent: Agent) -> None:
    stream = open_stream(agent, TCPTarget("169.254.169.254", 80), b"", b"GET / HTTP/1.1\r\n\r\n")
    await stream.wait_done()
    assert stream.refused is not None and stream.refused[0] == OpenErrorCode.DENIED


async def test_large_response_relayed_intact(agent: Agent) -> None:
    stream = open_stream(agent, KubeAPITarget(), identity_metadata(), get("/big?n=3000000"))
    stream.send_eof()
    await stream.wait_done(10)
    status, headers, body = stream.response()
    assert status == 200 and len(body) == 3_000_000 == int(headers["content-length"])


async def test_concurrent_large_responses_never_mix_through_the_shared_read_buffer(
    agent: Agent,
) -> None:
    fills = "abcd"
    streams = [open_stream(agent, KubeAPITarget(), identity_metadata(),
                           get(f"/big?n=2000000&fill={fill}")) for fill in fills]
    for stream in streams:
        stream.send_eof()
    await asyncio.gather(*(stream.wait_done(15) for stream in streams))
    assert agent.pool.dials == len(fills)  # four connections read at the same time
    for fill, stream in zip(fills, streams, strict=True):
        status, _, body = stream.response()
        assert status == 200 and len(body) == 2_000_000
        assert body.count(fill.encode()) == len(body)


def ws_frame(payload: bytes, opcode: int = 1) -> bytes:
    mask = os.urandom(4)
    masked = bytes(b ^ mask[i % 4] for i, b in enumerate(payload))
    assert len(payload) < 126
    return struct.pack("!BB", 0x80 | opcode, 0x80 | len(payload)) + mask + masked


async def test_websocket_upgrade_spliced(agent: Agent, upstream: Upstream) -> None:
    key = base64.b64encode(os.urandom(16)).decode()
    bearer = "base64url.bearer.authorization.k8s.io." + base64.urlsafe_b64encode(
        HUB_TOKEN.encode()).decode().rstrip("=")
    request = get("/ws", "Connection: Upgrade", "Upgrade: websocket",
                  f"Sec-WebSocket-Key: {key}", "Sec-WebSocket-Version: 13",
                  f"Sec-WebSocket-Protocol: {bearer}, v5.channel.k8s.io")
    stream = open_stream(agent, KubeAPITarget(), identity_metadata(), request)
    await stream.wait(lambda: b"\r\n\r\n" in stream.received)
    assert stream.received.startswith(b"HTTP/1.1 101")
    head_len = stream.received.index(b"\r\n\r\n") + 4
    stream.send(ws_frame(b"hello"))
    await stream.wait(lambda: b"echo:hello" in stream.received)
    assert not stream.eof
    stream.send(ws_frame(b"\x03\xe8", opcode=8))  # close
    await stream.wait(lambda: stream.eof, timeout=5)
    assert len(stream.received) > head_len
    entry = upstream.seen[-1]
    protocols = [v for k, v in seen_headers(entry) if k == "sec-websocket-protocol"]
    assert protocols == ["v5.channel.k8s.io"]
    assert HUB_TOKEN not in json.dumps(entry)
    assert agent.pool.idle == 0  # an upgraded connection never returns to the pool


@pytest.mark.parametrize("head", [
    b"GET /x HTTP/1.1\r\nHost: x\r\nContent-Length: 1\r\nTransfer-Encoding: chunked\r\n\r\n",
    b"GET /x HTTP/1.1\r\nHost: x\r\nX: a\r\n folded\r\n\r\n",
    b"CONNECT 10.0.0.1:22 HTTP/1.1\r\nHost: x\r\n\r\n",
    b"GET /x HTTP/1.1\r\n" + b"X-Big: " + b"a" * 300_000 + b"\r\n\r\n",
])
async def test_bad_request_head_refused_before_any_upstream_byte(
    agent: Agent, upstream: Upstream, head: bytes
) -> None:
    stream = open_stream(agent, KubeAPITarget(), identity_metadata(), head)
    await stream.wait_done()
    assert stream.refused is not None and stream.refused[0] == OpenErrorCode.PROTOCOL
    assert agent.pool.dials == 0 and upstream.seen == []


async def test_upstream_dies_before_answering_gives_502_status(agent: Agent) -> None:
    stream = open_stream(agent, KubeAPITarget(), identity_metadata(), get("/die"))
    stream.send_eof()
    await stream.wait_done()
    assert stream.accepted and stream.eof
    status, _, body = stream.response()
    assert status == 502
    assert json.loads(body)["kind"] == "Status"
    assert "127.0.0.1" not in body.decode()  # no internal addresses in errors


async def test_passthrough_forwards_the_callers_token_without_impersonation(
    agent: Agent, upstream: Upstream
) -> None:
    from gateway.wire.identity import Identity

    metadata = Identity(user="", groups=(), uid="", passthrough=True).to_metadata()
    request = get("/echo/pt", "Authorization: Bearer managed-sa-token",
                  "Impersonate-User: system:admin")
    stream = open_stream(agent, KubeAPITarget(), metadata, request)
    stream.send_eof()
    await stream.wait_done()
    headers = seen_headers(json.loads(stream.response()[2]))
    assert [v for k, v in headers if k == "authorization"] == ["Bearer managed-sa-token"]
    assert not [k for k, _ in headers if k.startswith("impersonate")]
    assert AGENT_TOKEN not in json.dumps(headers)


async def test_stream_back_pressure_pauses_the_upstream_socket(agent: Agent) -> None:
    class SlowStream(FakeStream):
        """Signals a full window after 64 KiB, like the tunnel does, until the test drains."""

        def write(self, data: bytes | bytearray | memoryview) -> None:
            super().write(data)
            if len(self.received) - self.drained > 65536 and not self.full:
                self.full = True
                self.protocol.pause_writing()

    stream_cls: Any = SlowStream
    stream_cls.drained, stream_cls.full = 0, False
    protocol = agent.on_open(OpenRequest(9, KubeAPITarget(), identity_metadata()))
    stream = stream_cls(protocol, KubeAPITarget(), b"")
    stream.send(get("/big?n=2000000"))
    stream.send_eof()
    await stream.wait(lambda: stream.full)
    await asyncio.sleep(0.3)
    conn = protocol.conn
    assert conn is not None and conn._reading_paused
    size = len(stream.received)
    await asyncio.sleep(0.2)
    assert len(stream.received) - size < 300_000  # bounded by socket buffers, not the body
    for _ in range(200):
        if stream.eof:
            break
        stream.drained, stream.full = len(stream.received), False
        protocol.resume_writing()
        await stream.wait(lambda: stream.full or stream.eof)
    assert stream.eof
    status, _, body = stream.response()
    assert status == 200 and len(body) == 2_000_000


async def test_tcp_target_relayed_when_allowed(upstream: Upstream, tmp_path: Path) -> None:
    async def echo(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        data = await reader.read()  # until half-close
        writer.write(data[::-1])
        await writer.drain()
        writer.close()

    server = await asyncio.start_server(echo, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]

    class TCPPolicy(FakePolicy):
        async def resolve(self, target: Any) -> Resolved:
            if isinstance(target, TCPTarget) and (target.host, target.port) == ("echo", 1):
                return Resolved("127.0.0.1", port, None, False)
            return await super().resolve(target)

    agent = Agent(cluster="c1", policy=TCPPolicy(("127.0.0.1", 1), {}), kube=None)
    async with server:
        stream = open_stream(agent, TCPTarget("echo", 1), b"", b"hello ")
        stream.send(b"tcp")
        stream.send_eof()
        await stream.wait(lambda: stream.eof)
        assert stream.accepted and bytes(stream.received) == b"pct olleh"


async def test_agent_without_kube_api_refuses_kube_streams(upstream: Upstream) -> None:
    agent = Agent(cluster="c1", policy=FakePolicy(("127.0.0.1", 1), {}), kube=None)
    stream = open_stream(agent, KubeAPITarget(), identity_metadata(), get("/x"))
    await stream.wait_done()
    assert stream.refused is not None and stream.refused[0] == OpenErrorCode.DENIED


async def test_https_service_needs_a_ca_unless_explicitly_insecure(upstream: Upstream) -> None:
    policy = FakePolicy(("127.0.0.1", 1), {("demo", "web", 443): upstream.port})
    target = ServiceTarget("demo", "web", 443, "https")
    strict = Agent(cluster="c1", policy=policy, kube=None)  # no CA to verify it with
    stream = open_stream(strict, target, b"", get("/echo/s"))
    await stream.wait_done()
    assert stream.refused is not None and stream.refused[0] == OpenErrorCode.DENIED
    insecure = Agent(cluster="c1", policy=policy, kube=None,
                     insecure_services=frozenset({("demo", "web", 443)}))
    stream = open_stream(insecure, target, b"", get("/echo/s"))
    stream.send_eof()
    await stream.wait_done()
    assert stream.response()[0] == 200


async def test_pool_limit_is_a_typed_overload_refusal(agent: Agent) -> None:
    agent.pool.max_connections = 1
    watch = open_stream(agent, KubeAPITarget(), identity_metadata(), get("/watch"))
    watch.send_eof()
    await watch.wait(lambda: b"ADDED" in watch.received)
    second = open_stream(agent, KubeAPITarget(), identity_metadata(), get("/echo/2"))
    await second.wait_done()
    assert second.refused is not None and second.refused[0] == OpenErrorCode.OVERLOAD
    watch.client_reset()
