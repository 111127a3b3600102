"""The join side door of the tunnel port: one certificate request per TLS connection.

A managed cluster that reaches the hub only on the tunnel port (:8091) must be able to get its
first agent certificate there, before it has one. The listener therefore also accepts, on the
separate ALPN :data:`JOIN_ALPN`, a TLS 1.3 connection **with or without** a client certificate
(see ``tunnel/PROTOCOL.md`` "Join"). Such a connection carries exactly one HTTP/1.1 request,
``POST /v1/join`` or ``POST /v1/renew`` with a ``Content-Length`` body of at most
:data:`MAX_BODY` bytes, gets exactly one answer, and is closed. Nothing else is served on it:
no tunnel frames, no keep-alive, no other method or path (each a 4xx and close). Every other
connection on the port still needs a verified client certificate naming a cluster (the
listener refuses a tunnel-ALPN connection without one).

What the body means (a JSON join token + CSR, or a CSR signed off by the client certificate)
is not the tunnel's business: the listener hands :class:`JoinRequest` (path, body, the verified
peer certificate if any) to a handler the gateway provides and writes back its
:class:`JoinAnswer`. The parsing here is pure (:func:`parse_request`, :func:`parse_answer`);
:class:`JoinExchange` (hub) and :func:`request` (agent) are thin asyncio adapters.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import ssl
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import cast

from tunnel.proxy import ProxyConfig, open_through_proxy

JOIN_ALPN = "hubproxy-join/1"
PATHS = ("/v1/join", "/v1/renew")
MAX_HEAD = 4096
MAX_BODY = 16 * 1024
MAX_ANSWER = 64 * 1024
REQUEST_TIMEOUT = 10.0  # the whole request must arrive by then

_REASONS = {200: "OK", 400: "Bad Request", 403: "Forbidden", 404: "Not Found",
            405: "Method Not Allowed", 408: "Request Timeout", 411: "Length Required",
            413: "Payload Too Large", 429: "Too Many Requests", 500: "Internal Server Error",
            503: "Service Unavailable"}


class JoinProtocolError(ValueError):
    """The request breaks the one-request rule; ``status`` is the answer to send."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


@dataclass(frozen=True)
class JoinRequest:
    path: str  # one of PATHS
    body: bytes
    peer_certificate: bytes | None  # DER, verified against the agent CA by TLS; None: none sent
    peer: tuple[str, int] | None


@dataclass(frozen=True)
class JoinAnswer:
    status: int
    body: bytes  # JSON


JoinHandler = Callable[[JoinRequest], Awaitable[JoinAnswer]]


def parse_request(buffer: bytes) -> tuple[str, bytes] | None:
    """(path, body) once ``buffer`` holds the whole request, None while it is incomplete."""
    end = buffer.find(b"\r\n\r\n")
    if end < 0:
        if len(buffer) > MAX_HEAD:
            raise JoinProtocolError(400, "request head too large")
        return None
    if end > MAX_HEAD:
        raise JoinProtocolError(400, "request head too large")
    lines = buffer[:end].split(b"\r\n")
    parts = lines[0].split(b" ")
    if len(parts) != 3 or parts[2] != b"HTTP/1.1":
        raise JoinProtocolError(400, "malformed request line")
    method, path = parts[0], parts[1].decode("ascii", "replace")
    if path not in PATHS:
        raise JoinProtocolError(404, f"only {', '.join(PATHS)} are served on {JOIN_ALPN}")
    if method != b"POST":
        raise JoinProtocolError(405, "only POST")
    length: int | None = None
    for line in lines[1:]:
        name, colon, value = line.partition(b":")
        if not colon:
            raise JoinProtocolError(400, "malformed header line")
        name = name.strip().lower()
        if name == b"transfer-encoding":
            raise JoinProtocolError(400, "only Content-Length bodies")
        if name == b"content-length":
            if length is not None or not value.strip().isdigit():
                raise JoinProtocolError(400, "bad Content-Length")
            length = int(value.strip())
    if length is None:
        raise JoinProtocolError(411, "Content-Length required")
    if length > MAX_BODY:
        raise JoinProtocolError(413, f"body over {MAX_BODY} bytes")
    body = buffer[end + 4:]
    if len(body) < length:
        return None
    if len(body) > length:
        raise JoinProtocolError(400, "one request per connection")
    return path, body


def encode_request(path: str, body: bytes, host: str) -> bytes:
    return (f"POST {path} HTTP/1.1\r\nHost: {host}\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n").encode() + body


def encode_answer(answer: JoinAnswer) -> bytes:
    reason = _REASONS.get(answer.status, "Error")
    return (f"HTTP/1.1 {answer.status} {reason}\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(answer.body)}\r\nConnection: close\r\n\r\n"
            ).encode() + answer.body


def parse_answer(data: bytes) -> JoinAnswer:
    """The hub's whole answer (read to EOF); ValueError if it is not one."""
    end = data.find(b"\r\n\r\n")
    if end < 0:
        raise ValueError("incomplete answer from the hub")
    status_line = data[:end].split(b"\r\n")[0].split(b" ")
    if len(status_line) < 2 or status_line[0] != b"HTTP/1.1" or not status_line[1].isdigit():
        raise ValueError("malformed answer from the hub")
    return JoinAnswer(int(status_line[1]), data[end + 4:])


def _error_body(message: str) -> bytes:
    import json

    return json.dumps({"error": message}).encode()


class JoinExchange(asyncio.Protocol):
    """The hub's end of one join connection: read one request, answer it, close."""

    def __init__(self, handler: JoinHandler, peer_certificate: bytes | None,
                 peer: tuple[str, int] | None, on_done: Callable[[], None] | None = None,
                 timeout: float = REQUEST_TIMEOUT) -> None:
        self.handler = handler
        self.peer_certificate = peer_certificate
        self.peer = peer
        self.on_done = on_done
        self.timeout = timeout
        self.transport: asyncio.Transport | None = None
        self._buffer = bytearray()
        self._task: asyncio.Task[None] | None = None
        self._timer: asyncio.TimerHandle | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # (uvloop's SSL transport is not an asyncio.Transport subclass, but behaves as one)
        self.transport = cast(asyncio.Transport, transport)
        self._timer = asyncio.get_running_loop().call_later(
            self.timeout, self._answer_now, JoinAnswer(408, _error_body("request too slow")))

    def data_received(self, data: bytes) -> None:
        if self._task is not None or self.transport is None:
            return  # one request only; anything after it is ignored until the close
        self._buffer += data
        try:
            parsed = parse_request(bytes(self._buffer))
        except JoinProtocolError as exc:
            self._answer_now(JoinAnswer(exc.status, _error_body(str(exc))))
            return
        if parsed is None:
            return
        path, body = parsed
        self.transport.pause_reading()
        request = JoinRequest(path, body, self.peer_certificate, self.peer)
        self._task = asyncio.get_running_loop().create_task(self._handle(request))

    async def _handle(self, request: JoinRequest) -> None:
        try:
            answer = await self.handler(request)
        except Exception:  # the handler's bug must not leave the agent hanging
            answer = JoinAnswer(500, _error_body("internal error"))
        self._answer_now(answer)

    def _answer_now(self, answer: JoinAnswer) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        transport, self.transport = self.transport, None
        if transport is None or transport.is_closing():
            return
        transport.write(encode_answer(answer))
        transport.close()
        asyncio.get_running_loop().call_later(2.0, transport.abort)  # a peer not reading

    def connection_lost(self, exc: Exception | None) -> None:
        if self._timer is not None:
            self._timer.cancel()
        if self._task is not None and not self._task.done():
            self._task.cancel()
        self.transport = None
        if self.on_done is not None:
            self.on_done()


async def request(host: str, port: int, context: ssl.SSLContext, path: str, body: bytes, *,
                  server_hostname: str | None = None, proxy: ProxyConfig | None = None,
                  timeout: float = REQUEST_TIMEOUT) -> JoinAnswer:
    """One join or renew request to the hub (``context`` must offer :data:`JOIN_ALPN`).

    Raises OSError/ssl.SSLError/TimeoutError when the hub cannot be reached, ValueError for an
    answer that is not one.
    """
    async with asyncio.timeout(timeout):
        sock: socket.socket | None = None
        if proxy is not None:
            sock = await open_through_proxy(proxy, host, port, timeout)
        if sock is not None:
            reader, writer = await asyncio.open_connection(
                sock=sock, ssl=context, server_hostname=server_hostname or host)
        else:
            reader, writer = await asyncio.open_connection(
                host, port, ssl=context, server_hostname=server_hostname or host)
        try:
            ssl_object = writer.get_extra_info("ssl_object")
            if ssl_object is None or ssl_object.selected_alpn_protocol() != JOIN_ALPN:
                raise ValueError(f"the hub does not serve {JOIN_ALPN} (is joining enabled "
                                 "on the gateway?)")
            writer.write(encode_request(path, body, server_hostname or host))
            data = await reader.read(MAX_ANSWER + MAX_HEAD)
            while True:
                more = await reader.read(MAX_ANSWER + MAX_HEAD)
                if not more:
                    break
                data += more
                if len(data) > MAX_ANSWER + MAX_HEAD:
                    raise ValueError("answer from the hub too large")
            return parse_answer(data)
        finally:
            writer.close()
            with contextlib.suppress(Exception):
                await writer.wait_closed()
