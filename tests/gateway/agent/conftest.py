"""Fixtures for the agent: a TLS upstream (aiohttp) and a fake tunnel stream that records.

The fake stream has the shape of ``tunnel.connection.TunnelStream`` (write, write_eof,
accept, refuse, reset, pause/resume_reading) and drives the protocol the way the tunnel does
(connection_made, data_received, eof_received, connection_lost), so the exchange is tested
against a real apiserver-like HTTP server without a tunnel.
"""

from __future__ import annotations

import asyncio
import json
import ssl
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

import pytest
import trustme
from aiohttp import WSMsgType, web

from tests.support import free_port


class FakeStream:
    stream_id = 7
    alone = False  # TunnelStream.alone: the session's only stream (True: writes go at once)

    def __init__(self, protocol: Any, target: Any = None, metadata: bytes = b"") -> None:
        from tunnel.errors import OpenRefused, StreamReset

        self._OpenRefused, self._StreamReset = OpenRefused, StreamReset
        self.protocol = protocol
        self.target = target
        self.metadata = metadata
        self.received = bytearray()
        self.eof = False  # the agent half-closed (end of response)
        self.peer_eof = False
        self.accepted = False
        self.refused: tuple[Any, str] | None = None
        self.reset_code: Any = None
        self.paused = False
        self.lost = False
        self.changed = asyncio.Event()
        protocol.connection_made(self)

    # TunnelStream API used by the agent
    def write(self, data: bytes | bytearray | memoryview) -> None:
        assert not self.eof, "write after write_eof"
        self.received += data
        self.changed.set()

    def write_eof(self) -> None:
        self.eof = True
        self.changed.set()
        self._maybe_closed()

    def accept(self) -> None:
        self.accepted = True

    def refuse(self, code: Any, message: str = "") -> None:
        assert not self.accepted
        self.refused = (code, message)
        self.changed.set()
        self._lose(self._OpenRefused(code, message))

    def reset(self, code: Any = None) -> None:
        self.reset_code = code
        self.changed.set()
        self._lose(self._StreamReset(code))

    def pause_reading(self) -> None:
        self.paused = True

    def resume_reading(self) -> None:
        self.paused = False

    def get_write_buffer_size(self) -> int:
        return 0

    def is_closing(self) -> bool:
        return self.lost

    # driver side (what the gateway would do)
    def send(self, data: bytes) -> None:
        self.protocol.data_received(data)

    def send_eof(self) -> None:
        self.peer_eof = True
        self.protocol.eof_received()
        self._maybe_closed()

    def client_reset(self) -> None:
        from tunnel.errors import ResetCode

        self._lose(self._StreamReset(ResetCode.CANCEL))

    def _maybe_closed(self) -> None:
        if self.eof and self.peer_eof:
            self._lose(None)

    def _lose(self, exc: Any) -> None:
        if not self.lost:
            self.lost = True
            self.protocol.connection_lost(exc)

    async def wait(self, predicate: Any, timeout: float = 5.0) -> None:
        async with asyncio.timeout(timeout):
            while not predicate():
                self.changed.clear()
                await self.changed.wait()

    async def wait_done(self, timeout: float = 5.0) -> None:
        await self.wait(lambda: self.eof or self.refused or self.reset_code is not None, timeout)

    def response(self) -> tuple[int, dict[str, str], bytes]:
        head, _, body = bytes(self.received).partition(b"\r\n\r\n")
        lines = head.decode().split("\r\n")
        status = int(lines[0].split()[1])
        headers = {k.lower(): v.strip() for k, _, v in (ln.partition(":") for ln in lines[1:])}
        return status, headers, body


class Collect:
    """StreamProtocol on the hub side: collects the response until the agent's EOF."""

    def __init__(self) -> None:
        self.data = bytearray()
        self.done: asyncio.Future[Any] = asyncio.get_running_loop().create_future()

    def connection_made(self, stream: Any) -> None:
        self.stream = stream

    def data_received(self, data: bytes | memoryview) -> None:
        self.data += data

    def eof_received(self) -> None:
        if not self.done.done():
            self.done.set_result(None)

    def connection_lost(self, exc: Any) -> None:
        if not self.done.done():
            self.done.set_result(exc)

    def pause_writing(self) -> None:
        pass

    def resume_writing(self) -> None:
        pass


@dataclass
class Upstream:
    host: str
    port: int
    ca_file: str
    ssl_context: ssl.SSLContext
    seen: list[dict[str, Any]] = field(default_factory=list)
    disconnects: list[str] = field(default_factory=list)
    peers: set[tuple[str, int]] = field(default_factory=set)


@pytest.fixture(scope="session")
def ca() -> trustme.CA:
    return trustme.CA()


@pytest.fixture
async def upstream(ca: trustme.CA, tmp_path: Any) -> AsyncIterator[Upstream]:
    """A TLS HTTP server that records what it received (headers, peer) and streams."""
    server_cert = ca.issue_cert("127.0.0.1", "localhost")
    server_ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    server_cert.configure_cert(server_ctx)
    ca_file = tmp_path / "upstream-ca.crt"
    ca.cert_pem.write_to_path(str(ca_file))
    client_ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    client_ctx.load_verify_locations(cafile=str(ca_file))
    up = Upstream("127.0.0.1", free_port(), str(ca_file), client_ctx)

    def record(request: web.Request, body: bytes = b"") -> dict[str, Any]:
        peer = request.transport.get_extra_info("peername") if request.transport else None
        if peer:
            up.peers.add(tuple(peer[:2]))
        entry = {"method": request.method, "path": request.path_qs,
                 "headers": list(request.headers.items()), "body": body.decode(errors="replace")}
        up.seen.append(entry)
        return entry

    async def echo(request: web.Request) -> web.Response:
        body = await request.read()
        return web.json_response(record(request, body))

    async def watch(request: web.Request) -> web.StreamResponse:
        record(request)
        resp = web.StreamResponse()
        resp.enable_chunked_encoding()
        await resp.prepare(request)
        try:
            for i in range(1000):
                await resp.write(json.dumps({"type": "ADDED", "n": i}).encode() + b"\n")
                await asyncio.sleep(0.05)
        except (ConnectionResetError, asyncio.CancelledError):
            up.disconnects.append(request.path)
            raise
        return resp

    async def big(request: web.Request) -> web.Response:
        record(request)
        fill = request.query.get("fill", "x").encode()[:1]
        return web.Response(body=fill * int(request.query.get("n", "1000000")))

    async def ws(request: web.Request) -> web.WebSocketResponse:
        record(request)
        sock = web.WebSocketResponse(protocols=("v5.channel.k8s.io",))
        await sock.prepare(request)
        async for msg in sock:
            if msg.type == WSMsgType.TEXT:
                await sock.send_str("echo:" + msg.data)
            elif msg.type == WSMsgType.BINARY:
                await sock.send_bytes(msg.data)
        return sock

    async def die(request: web.Request) -> web.Response:
        record(request)
        assert request.transport is not None
        request.transport.abort()  # the upstream vanishes before answering
        await asyncio.sleep(0.1)
        return web.Response(text="never sent")

    app = web.Application()
    app.router.add_route("*", "/echo{tail:.*}", echo)
    app.router.add_get("/watch", watch)
    app.router.add_get("/big", big)
    app.router.add_get("/ws", ws)
    app.router.add_get("/die", die)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, up.host, up.port, ssl_context=server_ctx)
    await site.start()
    try:
        yield up
    finally:
        await runner.cleanup()
