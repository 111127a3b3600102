"""Taking over an aiohttp connection after a non-WebSocket `101 Switching Protocols`.

aiohttp only knows WebSocket upgrades, so for `Upgrade: SPDY/3.1` we do what its
`WebSocketResponse` does internally: install our own "payload parser" on the request's protocol
(`RequestHandler.set_parser`) *before* the 101 goes out, so every byte the client sends after the
request head is handed to us instead of aiohttp's HTTP parser; aiohttp calls its `feed_eof()` when
the connection is lost. We write straight to `request.transport` (headers are flushed first with
`send_headers()`, so ordering holds) and use the response's writer only for `drain()`
back-pressure. The handler must keep running until the upgraded conversation ends, then close the
transport; the response is marked force-close so aiohttp never reuses the connection.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Mapping

from aiohttp import web

from kubesim.streams.status import error_response


class _Feeder:
    """Duck-types aiohttp's WebSocketReader: `feed_data` returns (eof, tail)."""

    def __init__(self, on_data: Callable[[bytes], None], on_eof: Callable[[], None]) -> None:
        self._on_data = on_data
        self._on_eof = on_eof

    def feed_data(self, data: bytes) -> tuple[bool, bytes]:
        self._on_data(bytes(data))
        return False, b""

    def feed_eof(self) -> None:
        self._on_eof()


class RawConnection:
    """The byte pipe left after a 101: `write`, `drain`, `close`."""

    def __init__(self, transport: asyncio.Transport, response: web.StreamResponse, writer) -> None:
        self._transport = transport
        self.response = response
        self._writer = writer

    def write(self, data: bytes) -> None:
        if not self._transport.is_closing():
            self._transport.write(data)

    async def drain(self) -> None:
        await self._writer.drain()

    def close(self) -> None:
        self._transport.close()

    @property
    def closing(self) -> bool:
        return self._transport.is_closing()


async def switch_protocols(
    request: web.Request,
    headers: Mapping[str, str],
    on_data: Callable[[bytes], None],
    on_eof: Callable[[], None],
) -> RawConnection:
    """Send `101` with `headers` and route every later inbound byte to `on_data`."""
    transport = request.transport
    if transport is None:
        raise ConnectionResetError("client went away before the upgrade")
    response = web.StreamResponse(status=101, headers={"Connection": "Upgrade", **headers})
    response.force_close()
    request.protocol.set_parser(_Feeder(on_data, on_eof))  # type: ignore[arg-type]
    writer = await response.prepare(request)
    assert writer is not None
    writer.send_headers()
    return RawConnection(transport, response, writer)


def negotiate(request: web.Request, supported: tuple[str, ...]) -> str | None:
    """httpstream.Handshake: the first protocol the client offers that we support.

    Returns "" when the client offered nothing (legacy clients), None when nothing matches."""
    offered = [
        p.strip()
        for value in request.headers.getall("X-Stream-Protocol-Version", [])
        for p in value.split(",")
        if p.strip()
    ]
    if not offered:
        return ""
    for candidate in offered:
        if candidate in supported:
            return candidate
    return None


def negotiation_failed(request: web.Request, supported: tuple[str, ...]) -> web.Response:
    offered = ", ".join(request.headers.getall("X-Stream-Protocol-Version", []))
    return error_response(
        403,
        f"unable to upgrade: unable to negotiate protocol: client supports [{offered}], "
        f"server supports [{', '.join(supported)}]",
        "Forbidden",
    )
