"""The least a hop of hubproxy's design can cost in Python: issue 26's floor, measured.

    python -m bench.hopfloor --listen HOST:PORT --cert FILE --key FILE
                             --upstream https://HOST:PORT --upstream-ca FILE

hubproxy puts two Python processes between a client and the apiserver (the gateway and the
agent), and each of them terminates TLS on both of its sides: the client's and the tunnel's, the
tunnel's and the apiserver's. This program is one such hop with everything else taken away: on
uvloop, with asyncio Protocols (no streams, no tasks per request), it finds each request's head
and sends it on verbatim over its own keep-alive TLS connection to the upstream, finds the
response head's ``Content-Length`` (or the end of its chunks) and relays the bytes back. No
parsing beyond the framing, no validation, no authentication, no multiplexing, no audit, no
metrics, no limits: it is not a proxy anyone should run, only the floor under one.

Two of them in series (``bench gateway --only floor-2hop``) cost what the design's I/O and
framing cost at the least: what hubproxy spends beyond that is its own Python (DESIGN §2 and §6:
strict parsing, admission, the tunnel's streams and windows, HTTP/2 to the apiserver, the audit
line, metrics). Requests with bodies, trailers and upgrades are not handled: the bench sends GETs.
"""

from __future__ import annotations

import argparse
import asyncio
import ssl
import sys
from typing import Any
from urllib.parse import urlsplit

from bench.proxycli import proxy_arguments, run_until_interrupted

HEAD_END = b"\r\n\r\n"
CONTENT_LENGTH = b"\r\ncontent-length:"
CHUNKED = b"\r\ntransfer-encoding: chunked"


class ChunkedEnd:
    """Where a chunked body ends (sizes and CRLFs only; no trailers: the upstream sends none)."""

    def __init__(self) -> None:
        self.left = 0  # data bytes (and their CRLF) of the current chunk still to pass
        self.line = bytearray()  # a size line being read
        self.done = False

    def feed(self, data: bytes) -> None:
        at, end = 0, len(data)
        while at < end and not self.done:
            if self.left:
                step = min(self.left, end - at)
                self.left -= step
                at += step
                continue
            nl = data.find(b"\n", at)
            if nl < 0:
                self.line += data[at:]
                return
            self.line += data[at:nl]
            at = nl + 1
            line, self.line = bytes(self.line).strip(), bytearray()
            if not line:
                continue  # the CRLF after a chunk's data
            size = int(line.split(b";")[0], 16)
            if size == 0:
                self.done = True  # its final CRLF follows in the same read here
            self.left = size + 2


class Upstream(asyncio.Protocol):
    """The hop's keep-alive connection to the upstream, for one client connection."""

    def __init__(self, client: ClientSide) -> None:
        self.client = client
        self.transport: Any = None
        self.buf = bytearray()
        self.body_left = -1  # -1: reading a head
        self.chunked: ChunkedEnd | None = None

    def connection_made(self, transport: Any) -> None:
        self.transport = transport

    def data_received(self, data: bytes) -> None:
        client = self.client
        if self.chunked is not None:
            self.chunked.feed(data)
            if self.chunked.done:
                self.chunked = None
            client.transport.write(data)
            return
        if self.body_left >= 0:
            self.body_left -= len(data)
            client.transport.write(data)
            if self.body_left <= 0:
                self.body_left = -1
            return
        self.buf += data
        end = self.buf.find(HEAD_END)
        if end < 0:
            return
        end += len(HEAD_END)
        head = bytes(self.buf[:end]).lower()
        out = bytes(self.buf)
        self.buf.clear()
        if CHUNKED in head:
            chunked = ChunkedEnd()
            chunked.feed(out[end:])
            self.chunked = None if chunked.done else chunked
        else:
            self.body_left = response_length(head) - (len(out) - end)
            if self.body_left <= 0:
                self.body_left = -1
        client.transport.write(out)

    def connection_lost(self, exc: Exception | None) -> None:
        self.client.transport.close()


def response_length(head: bytes) -> int:
    """The body length a lower-cased response head announces (0 if it announces none)."""
    at = head.find(CONTENT_LENGTH)
    if at < 0:
        return 0
    start = at + len(CONTENT_LENGTH)
    return int(head[start:head.index(b"\r\n", start)])


class ClientSide(asyncio.Protocol):
    """One client connection: each request head goes on as it arrived."""

    def __init__(self, upstream_host: str, upstream_port: int,
                 upstream_tls: ssl.SSLContext) -> None:
        self.address = (upstream_host, upstream_port, upstream_tls)
        self.transport: Any = None
        self.upstream: Upstream | None = None
        self.waiting = bytearray()  # what came before the upstream connection was up
        self.buf = bytearray()

    def connection_made(self, transport: Any) -> None:
        self.transport = transport
        host, port, tls = self.address
        asyncio.get_running_loop().create_task(self._connect(host, port, tls))

    async def _connect(self, host: str, port: int, tls: ssl.SSLContext) -> None:
        loop = asyncio.get_running_loop()
        try:
            _, upstream = await loop.create_connection(lambda: Upstream(self), host, port,
                                                       ssl=tls, server_hostname=host)
        except OSError:
            self.transport.close()
            return
        self.upstream = upstream
        if self.waiting:
            data, self.waiting = bytes(self.waiting), bytearray()
            self.data_received(data)

    def data_received(self, data: bytes) -> None:
        upstream = self.upstream
        if upstream is None:
            self.waiting += data
            return
        self.buf += data
        end = self.buf.rfind(HEAD_END)
        if end < 0:
            return
        end += len(HEAD_END)
        upstream.transport.write(bytes(self.buf[:end]))
        del self.buf[:end]

    def connection_lost(self, exc: Exception | None) -> None:
        if self.upstream is not None and self.upstream.transport is not None:
            self.upstream.transport.close()


async def start(listen: tuple[str, int], cert: str, key: str, upstream: tuple[str, int],
                upstream_ca: str) -> asyncio.Server:
    """Serve TLS on ``listen`` (port 0: any), relaying to the TLS ``upstream``."""
    server_tls = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    server_tls.load_cert_chain(cert, key)
    upstream_tls = ssl.create_default_context(cafile=upstream_ca)
    loop = asyncio.get_running_loop()
    return await loop.create_server(lambda: ClientSide(*upstream, upstream_tls), *listen,
                                    ssl=server_tls)


async def serve(args: argparse.Namespace) -> None:
    host, _, port = args.listen.rpartition(":")
    upstream = urlsplit(args.upstream)
    assert upstream.hostname is not None and upstream.port is not None
    server = await start((host, int(port)), args.cert, args.key,
                         (upstream.hostname, upstream.port), args.upstream_ca)
    print(f"hopfloor ready on {args.listen}", flush=True)
    async with server:
        await server.serve_forever()


def main(argv: list[str] | None = None) -> int:
    args = proxy_arguments("python -m bench.hopfloor", __doc__ or "", argv)
    return run_until_interrupted(serve(args))


if __name__ == "__main__":
    sys.exit(main())
