"""A gateway on real TLS sockets in front of in-test fake agents (no tunnel needed).

``FakeSession`` has the hub-side shape of ``tunnel.connection.TunnelSession.open_stream`` and
``FakeStream`` that of ``TunnelStream``; each stream is handed to an *agent* coroutine that
reads what the gateway sent (``await stream.request()``) and answers with canned bytes, so tests
assert on the exact bytes a managed cluster would receive. Also: a TokenReview stub behind the
real ``TokenAuthenticator`` (cache and all), a registry with the SessionRegistry API, a trustme
CA for the front door, and raw/aiohttp clients.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import ssl
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field, replace
from typing import Any

import pytest
import trustme

from gateway.hub.admission.auth import AuthUnavailable, TokenAuthenticator
from gateway.hub.admission.authorize import NoAuthorizer
from gateway.hub.admission.hubload import FailedAuthLimiter
from gateway.hub.app import Gateway
from gateway.hub.config import FrontDoorLimits, GatewayConfig
from gateway.wire.http1 import find_head_end, framing_for_request, parse_request_head
from tunnel.errors import ResetCode

HUB_TOKEN = "hub-token-ALICE-0123456789"
OTHER_TOKEN = "hub-token-BOB-9876543210"
MANAGED_TOKEN = "managed-sa-token-XYZ"


class FakeStream:
    """The hub end of one stream; the agent side is the test's coroutine."""

    _next_id = 1

    def __init__(self, protocol: Any, target: Any, metadata: bytes, initial: bytes) -> None:
        self.stream_id = FakeStream._next_id
        FakeStream._next_id += 2
        self.protocol = protocol
        self.target = target
        self.metadata = metadata
        self.received = bytearray(initial)  # everything the gateway wrote, in order
        self.eof = False  # the gateway half-closed
        self.reset_code: ResetCode | None = None
        self.agent_eof = False
        self.fin_in_open = False
        self.paused = False
        self.changed = asyncio.Event()
        self.closed = False

    # --- TunnelStream API (called by the gateway) ---
    def write(self, data: bytes | bytearray | memoryview) -> None:
        assert not self.eof, "write after write_eof"
        self.received += data
        self.changed.set()

    def writelines(self, chunks: Any) -> None:
        for chunk in chunks:
            self.write(chunk)

    def write_eof(self) -> None:
        self.eof = True
        self.changed.set()
        self._maybe_closed()

    def can_write_eof(self) -> bool:
        return True

    def reset(self, code: ResetCode = ResetCode.CANCEL) -> None:
        if self.closed:
            return
        self.reset_code = code
        self.closed = True
        self.changed.set()

    def pause_reading(self) -> None:
        self.paused = True

    def resume_reading(self) -> None:
        self.paused = False
        self.changed.set()

    def get_write_buffer_size(self) -> int:
        return 0

    def is_closing(self) -> bool:
        return self.closed or self.eof  # like TunnelStream: true once our FIN is queued

    # --- agent side (called by tests) ---
    async def wait(self, predicate: Callable[[], bool], timeout: float = 5.0) -> None:
        async with asyncio.timeout(timeout):
            while not predicate():
                self.changed.clear()
                await self.changed.wait()

    async def request(self, timeout: float = 5.0) -> tuple[Any, bytes]:
        """The parsed head and full body (as framed) once the request is complete."""

        def complete() -> bool:
            end = find_head_end(self.received)
            if end < 0:
                return False
            head = parse_request_head(bytes(self.received[:end]))
            if head.upgrade is not None:
                return True
            tracker = framing_for_request(head)
            tracker.feed(bytes(self.received[end:]))
            return tracker.complete or self.eof

        await self.wait(lambda: complete() or self.closed, timeout)
        end = find_head_end(self.received)
        return parse_request_head(bytes(self.received[:end])), bytes(self.received[end:])

    def send(self, data: bytes) -> None:
        if not self.closed:
            self.protocol.data_received(data)

    def send_eof(self) -> None:
        if self.closed:
            return
        self.agent_eof = True
        self.protocol.eof_received()
        self._maybe_closed()

    def fail(self, exc: Exception) -> None:
        if not self.closed:
            self.closed = True
            self.protocol.connection_lost(exc)

    def _maybe_closed(self) -> None:
        if self.eof and self.agent_eof and not self.closed:
            self.closed = True
            self.protocol.connection_lost(None)


Agent = Callable[[FakeStream], Awaitable[None]]


class FakeSession:
    """``open_stream`` like TunnelSession: connection_made first, then the agent runs."""

    def __init__(self, agent: Agent) -> None:
        self.agent = agent
        self.streams: list[FakeStream] = []
        self.tasks: set[asyncio.Task[None]] = set()
        self.active_streams = 0
        self.draining = False
        self.closed = False
        self.refuse_open: Exception | None = None

    def open_stream(self, target: Any, metadata: bytes, protocol: Any,
                    initial_data: bytes = b"", *, fin: bool = False) -> FakeStream:
        if self.refuse_open is not None:
            raise self.refuse_open
        stream = FakeStream(protocol, target, metadata, initial_data)
        stream.eof = fin  # the FIN rode in the OPEN (a later write_eof changes nothing)
        stream.fin_in_open = fin
        self.streams.append(stream)
        protocol.connection_made(stream)
        task = asyncio.ensure_future(self._run(stream))
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)
        return stream

    async def _run(self, stream: FakeStream) -> None:
        try:
            await self.agent(stream)
        except Exception as exc:  # a failing fake agent must be visible
            logging.getLogger("test.agent").exception("fake agent failed: %s", exc)
            stream.fail(RuntimeError("agent failed"))


class FakeRegistry:
    """The ``tunnel.registry.SessionRegistry`` API the gateway uses."""

    def __init__(self) -> None:
        self._sessions: dict[str, list[Any]] = {}
        self._subscribers: list[Callable[[str, bool], None]] = []
        self._session_subscribers: list[Callable[[str, Any, bool], None]] = []

    def subscribe_sessions(self, listener: Callable[[str, Any, bool], None]) -> None:
        self._session_subscribers.append(listener)

    def add(self, cluster: str, session: Any) -> None:
        first = not self._sessions.get(cluster)
        self._sessions.setdefault(cluster, []).append(session)
        for listener in self._session_subscribers:
            listener(cluster, session, True)
        if first:
            for cb in self._subscribers:
                cb(cluster, True)

    def remove(self, cluster: str, session: Any) -> None:
        sessions = self._sessions.get(cluster, [])
        if session in sessions:
            sessions.remove(session)
            for listener in self._session_subscribers:
                listener(cluster, session, False)
        if not sessions:
            self._sessions.pop(cluster, None)
            for cb in self._subscribers:
                cb(cluster, False)

    def pick(self, cluster: str) -> Any:
        live = [s for s in self._sessions.get(cluster, []) if not s.draining and not s.closed]
        return min(live, key=lambda s: s.active_streams) if live else None

    def clusters(self) -> frozenset[str]:
        return frozenset(self._sessions)

    def sessions(self, cluster: str) -> list[Any]:
        return list(self._sessions.get(cluster, []))

    def subscribe(self, cb: Callable[[str, bool], None]) -> None:
        self._subscribers.append(cb)


USERS: dict[str, dict[str, Any]] = {
    HUB_TOKEN: {"username": "system:serviceaccount:team:alice", "uid": "uid-a",
                "groups": ["system:serviceaccounts", "system:serviceaccounts:team",
                           "system:authenticated"], "extra": {}},
    OTHER_TOKEN: {"username": "bob", "uid": "", "groups": ["system:masters"], "extra": {}},
}


class StubReviewer:
    """TokenReview answers from USERS; ``down`` makes the hub unreachable."""

    def __init__(self) -> None:
        self.down = False
        self.seen: list[str] = []

    async def review(self, token: str, audiences: tuple[str, ...]) -> dict[str, Any]:
        self.seen.append(token)
        if self.down:
            raise AuthUnavailable("hub authentication is unavailable")
        user = USERS.get(token)
        if user is None:
            return {"authenticated": False, "error": "", "user": {}}
        return {"authenticated": True, "error": "", "user": user, "audiences": list(audiences)}


@dataclass
class Tls:
    ca: trustme.CA
    server: ssl.SSLContext
    client: ssl.SSLContext
    ca_file: str


@pytest.fixture(scope="session")
def tls(tmp_path_factory: pytest.TempPathFactory) -> Tls:
    ca = trustme.CA()
    cert = ca.issue_cert("localhost", "127.0.0.1")
    server = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    server.minimum_version = ssl.TLSVersion.TLSv1_2
    cert.configure_cert(server)
    client = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    ca.configure_trust(client)
    path = tmp_path_factory.mktemp("ca") / "ca.crt"
    ca.cert_pem.write_to_path(str(path))
    return Tls(ca, server, client, str(path))


@pytest.fixture(scope="session")
def h2tls(tls: Tls) -> Tls:
    """The harness' server context offering ALPN h2 and http/1.1, as front_tls does in
    production (the plain ``tls`` server offers no ALPN: HTTP/1.1 only)."""
    server = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    server.minimum_version = ssl.TLSVersion.TLSv1_2
    tls.ca.issue_cert("localhost", "127.0.0.1").configure_cert(server)
    server.set_alpn_protocols(["h2", "http/1.1"])
    return Tls(tls.ca, server, tls.client, tls.ca_file)


async def echo_agent(stream: FakeStream) -> None:
    """Answers 200 with JSON describing what it received (head, body, target, metadata)."""
    head, body = await stream.request()
    payload = json.dumps({
        "method": head.method.decode(), "target": head.target.decode(),
        "headers": [[n.decode(), v.decode()] for n, v in head.headers],
        "body": body.decode("latin-1"), "metadata": json.loads(stream.metadata),
        "target_kind": type(stream.target).__name__,
    }).encode()
    stream.send(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n"
                % len(payload) + payload)
    stream.send_eof()


@dataclass
class Harness:
    gateway: Gateway
    registry: FakeRegistry
    reviewer: StubReviewer
    tls: Tls
    sessions: dict[str, FakeSession] = field(default_factory=dict)

    @property
    def port(self) -> int:
        return self.gateway.front_port

    @property
    def url(self) -> str:
        return f"https://127.0.0.1:{self.port}"

    def connect_cluster(self, name: str, agent: Agent = echo_agent) -> FakeSession:
        session = FakeSession(agent)
        self.sessions[name] = session
        self.registry.add(name, session)
        return session

    def streams(self, name: str = "c1") -> list[FakeStream]:
        return self.sessions[name].streams

    async def open(self) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        return await asyncio.open_connection("127.0.0.1", self.port, ssl=self.tls.client,
                                             server_hostname="localhost")

    async def exchange(self, raw: bytes, *, timeout: float = 5.0) -> bytes:
        """Send raw bytes on a new connection; everything read until the server closes."""
        reader, writer = await self.open()
        writer.write(raw)
        try:
            async with asyncio.timeout(timeout):
                return await reader.read(-1)
        finally:
            writer.close()
            with contextlib.suppress(Exception):
                await writer.wait_closed()


async def read_response(reader: asyncio.StreamReader, timeout: float = 5.0
                        ) -> tuple[int, dict[str, str], bytes]:
    """One response (Content-Length or chunked) from a keep-alive connection."""
    async with asyncio.timeout(timeout):
        head = await reader.readuntil(b"\r\n\r\n")
        lines = head.decode("latin-1").split("\r\n")
        status = int(lines[0].split(" ")[1])
        headers = {}
        for line in lines[1:]:
            if line:
                k, _, v = line.partition(":")
                headers[k.strip().lower()] = v.strip()
        if status == 101 or 100 <= status < 200:
            return status, headers, b""
        if "content-length" in headers:
            body = await reader.readexactly(int(headers["content-length"]))
        elif headers.get("transfer-encoding") == "chunked":
            body = b""
            while True:
                size = int((await reader.readuntil(b"\r\n")).split(b";")[0], 16)
                chunk = await reader.readexactly(size + 2)
                if size == 0:
                    while chunk != b"\r\n":  # trailers
                        chunk = await reader.readuntil(b"\r\n")
                    break
                body += chunk[:-2]
        else:
            body = await reader.read(-1)
        return status, headers, body


def status_of(data: bytes) -> tuple[int, dict]:
    """The status and the Kubernetes ``Status`` body of a refusal (checked to be one)."""
    status, _, body = parse_raw(data)
    obj = json.loads(body)
    assert obj["kind"] == "Status" and obj["code"] == status
    return status, obj


def parse_raw(data: bytes) -> tuple[int, dict[str, str], bytes]:
    head, _, body = data.partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    headers = {}
    for line in lines[1:]:
        k, _, v = line.partition(":")
        headers[k.strip().lower()] = v.strip()
    return int(lines[0].split(" ")[1]), headers, body


def make_config(**overrides: Any) -> GatewayConfig:
    limits = overrides.pop("limits", FrontDoorLimits())
    base = GatewayConfig(listen=("127.0.0.1", 0), health_listen=("127.0.0.1", 0),
                         authorize="none", limits=limits, unknown_cluster_grace=0.0)
    return replace(base, **overrides)


@contextlib.asynccontextmanager
async def running(tls: Tls, *, authorizer: Any = None, audit_trail: Any = None,
                  clock: Callable[[], float] = time.monotonic, **overrides: Any
                  ) -> AsyncIterator[Harness]:
    """A started gateway with fakes around it; ``clock`` is the one the token cache and the
    failed-authentication limiter read (a ``ManualClock``: their time moves when the test
    says)."""
    config = make_config(**overrides)
    registry = FakeRegistry()
    reviewer = StubReviewer()
    authenticator = TokenAuthenticator(reviewer, ttl=config.token_cache_ttl,
                                       stale_grace=config.hub_outage_grace, clock=clock)

    async def probe() -> None:
        await reviewer.review("probe", ())

    gateway = Gateway(config, authenticator=authenticator,
                      authorizer=authorizer or NoAuthorizer(), registry=registry,
                      front_ssl=tls.server, hub_probe=probe, audit_trail=audit_trail)
    gateway.auth_failures = FailedAuthLimiter(rate=config.auth_failure_rate,
                                              burst=config.auth_failure_burst, clock=clock)
    await gateway.start()
    harness = Harness(gateway, registry, reviewer, tls)
    try:
        yield harness
    finally:
        await gateway.close()
        for session in harness.sessions.values():
            for task in list(session.tasks):
                task.cancel()
    # Every test also checks the accounting: no stream or in-flight slot leaked.
    for _ in range(50):
        if not gateway.connections:
            break
        await asyncio.sleep(0.01)
    assert gateway.metrics.active_streams == 0, "a stream was never accounted as closed"
    assert gateway.inflight == 0, "an in-flight slot was never released"
    assert len(gateway.stream_quota) == 0, "a long-running request's slot was never released"
    seats = gateway.seats
    assert seats is None or seats.executing == seats.waiting == 0, "a seat was never released"


@pytest.fixture
async def gw(tls: Tls) -> AsyncIterator[Harness]:
    async with running(tls) as harness:
        harness.connect_cluster("c1")
        yield harness


def get(path: str, token: str | None = HUB_TOKEN, extra: str = "", *, close: bool = False
        ) -> bytes:
    auth = f"Authorization: Bearer {token}\r\n" if token else ""
    conn = "Connection: close\r\n" if close else ""
    return (f"GET {path} HTTP/1.1\r\nHost: hub.example:9092\r\n{auth}{extra}{conn}\r\n"
            ).encode()
