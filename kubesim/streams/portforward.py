"""`pods/{name}/portforward`: the built-in container answers on every TCP port as an echo.

Three wire forms, as kube-apiserver/kubelet 1.31+ accept them:
- SPDY/3.1 (`POST`, `Upgrade: SPDY/3.1`, `X-Stream-Protocol-Version: portforward.k8s.io`): per
  forwarded connection the client opens an `error` then a `data` stream, both with headers
  `port` and `requestID`; we pair them by requestID (old clients: error id = data id + 2),
  echo the data stream and, when the client FINs it, FIN both; failures go as text on `error`.
- The same SPDY session tunnelled in binary WebSocket messages (`GET`, subprotocol
  `SPDY/3.1+portforward.k8s.io`, kubectl's default since 1.31). Message boundaries carry no
  meaning: they are a byte stream.
- The plain channel protocol (`GET`, subprotocol `v4.channel.k8s.io` or `portforward.k8s.io`,
  `?ports=80,8080`): for the k-th port channel 2k is data and 2k+1 is error; our first message on
  each channel is the port as uint16 little-endian; client messages carry raw data.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import struct
from typing import Any

from aiohttp import WSMsgType, web

from kubesim.streams import container as builtin
from kubesim.streams.channels import ChannelCodec
from kubesim.streams.spdy_session import OutboundQueue, SpdySession, SpdyStream, stop_task
from kubesim.streams.status import error_response
from kubesim.streams.upgrade import negotiate, negotiation_failed, switch_protocols

log = logging.getLogger(__name__)

PORTFORWARD_PROTOCOL = "portforward.k8s.io"
TUNNEL_PROTOCOL = "SPDY/3.1+portforward.k8s.io"
CHANNEL_PROTOCOLS = ("v4.channel.k8s.io", "portforward.k8s.io", "v4.base64.channel.k8s.io")
STREAM_PAIR_TIMEOUT = 30.0


def relay_address(pod: dict[str, Any], port: int) -> tuple[str, int] | None:
    """`kubesim.hubproxy.dev/port-<N>: host:port` sends port N to a real TCP server instead
    of the echo (for benchmarks and demos). Loopback only: kubesim is a test stand-in."""
    raw = (pod.get("metadata", {}).get("annotations") or {}).get(
        f"{builtin.ANNOTATION_PREFIX}port-{port}"
    )
    if not raw:
        return None
    host, _, target_port = raw.rpartition(":")
    if host not in ("127.0.0.1", "localhost", "[::1]") or not target_port.isdigit():
        return None
    return host.strip("[]"), int(target_port)


async def _relay(data: SpdyStream, address: tuple[str, int]) -> None:
    reader, writer = await asyncio.open_connection(*address)

    async def upstream() -> None:
        while chunk := await data.read():
            writer.write(chunk)
            await writer.drain()
        if writer.can_write_eof():
            writer.write_eof()

    sender = asyncio.ensure_future(upstream())
    try:
        while chunk := await reader.read(65536):
            data.write(chunk)
            await data.drain()
        await sender
    finally:
        await stop_task(sender)
        writer.close()


async def echo_streams(pod: dict[str, Any], data: SpdyStream, error: SpdyStream) -> None:
    """One forwarded connection: to the pod's echo, or relayed to a configured local server.

    Like the kubelet, a failure is written as text on the error stream; both streams then end."""
    raw_port = data.header("port") or ""
    try:
        port = int(raw_port)
        if not 0 < port < 65536:
            raise ValueError(raw_port)
    except ValueError:
        error.write(f'invalid port value "{raw_port}" for pod {builtin.pod_name(pod)}'.encode())
    else:
        address = relay_address(pod, port)
        if address is None:
            while chunk := await data.read():
                data.write(chunk)
                await data.drain()
        else:
            try:
                await _relay(data, address)
            except OSError as exc:
                error.write(
                    f"error forwarding port {port} to pod {builtin.pod_name(pod)}: {exc}".encode()
                )
    data.close()
    error.close()


class StreamPairer:
    """Matches each data stream with its error stream and starts an echo per pair."""

    def __init__(self, pod: dict[str, Any]) -> None:
        self.pod = pod
        self._pending: dict[str, dict[str, SpdyStream]] = {}
        self.tasks: set[asyncio.Task[None]] = set()

    def on_stream(self, stream: SpdyStream) -> None:
        stream.reply()
        kind = (stream.header("streamtype") or "").lower()
        request_id = stream.header("requestid")
        if request_id is None:  # pre-requestID clients: the error stream is opened first
            request_id = str(stream.stream_id if kind == "error" else stream.stream_id - 2)
        if kind not in ("data", "error"):
            stream.write(f"invalid stream type {kind!r}".encode())
            stream.close()
            return
        pair = self._pending.setdefault(request_id, {})
        pair[kind] = stream
        if len(pair) == 2:
            del self._pending[request_id]
            task = asyncio.ensure_future(echo_streams(self.pod, pair["data"], pair["error"]))
            self.tasks.add(task)
            task.add_done_callback(self.tasks.discard)

    async def stop(self) -> None:
        for task in list(self.tasks):
            await stop_task(task)


async def serve_portforward_spdy(request: web.Request, pod: dict[str, Any]) -> web.StreamResponse:
    protocol = negotiate(request, (PORTFORWARD_PROTOCOL,))
    if protocol is None:
        return negotiation_failed(request, (PORTFORWARD_PROTOCOL,))
    pairer = StreamPairer(pod)
    session = SpdySession(pairer.on_stream)
    conn = await switch_protocols(
        request,
        {"Upgrade": "SPDY/3.1", "X-Stream-Protocol-Version": PORTFORWARD_PROTOCOL},
        session.feed,
        session.connection_lost,
    )
    session.bind(conn.write, conn.drain)
    try:
        await session.closed.wait()  # kubectl keeps the session until it stops forwarding
    finally:
        await pairer.stop()
        session.connection_lost()
        conn.close()
    return conn.response


async def serve_portforward_tunnel(request: web.Request, pod: dict[str, Any]) -> web.StreamResponse:
    ws = web.WebSocketResponse(protocols=(TUNNEL_PROTOCOL,), autoping=True, timeout=2.0)
    await ws.prepare(request)
    outbound = OutboundQueue(ws.send_bytes)
    pairer = StreamPairer(pod)
    session = SpdySession(pairer.on_stream, outbound.put, outbound.drain)
    try:
        async for msg in ws:
            if msg.type == WSMsgType.BINARY:
                session.feed(msg.data)
                if session.closed.is_set():
                    break
    finally:
        session.connection_lost()
        await pairer.stop()
        await outbound.flush_and_stop()
        with contextlib.suppress(ConnectionError):
            await ws.close()
    return ws


def _ports(request: web.Request) -> list[int] | web.Response:
    ports: list[int] = []
    for value in request.query.getall("ports", []) + request.query.getall("port", []):
        for item in value.split(","):
            try:
                port = int(item)
                if not 0 < port < 65536:
                    raise ValueError(item)
            except ValueError:
                return error_response(400, f'invalid port "{item}"')
            ports.append(port)
    if not ports:
        return error_response(400, 'query parameter "port" is required')
    return ports


async def serve_portforward_channels(
    request: web.Request, pod: dict[str, Any]
) -> web.StreamResponse:
    ports = _ports(request)
    if isinstance(ports, web.Response):
        return ports
    ws = web.WebSocketResponse(protocols=CHANNEL_PROTOCOLS, autoping=True, timeout=2.0)
    await ws.prepare(request)
    codec = ChannelCodec(ws.ws_protocol or "channel.k8s.io")
    try:
        for index, port in enumerate(ports):
            prefix = struct.pack("<H", port)
            await codec.send(ws, 2 * index, prefix)
            await codec.send(ws, 2 * index + 1, prefix)
        async for msg in ws:
            decoded = codec.decode(msg)
            if decoded is None:
                continue
            channel, payload = decoded
            if channel % 2 == 0 and channel // 2 < len(ports) and payload:
                await codec.send(ws, channel, payload)  # echo on the same data channel
    except ConnectionError as exc:
        log.debug("port-forward client went away: %s", exc)
    finally:
        with contextlib.suppress(ConnectionError):
            await ws.close()
    return ws


def is_tunnel_request(request: web.Request) -> bool:
    offered = ",".join(request.headers.getall("Sec-WebSocket-Protocol", []))
    return TUNNEL_PROTOCOL in [p.strip() for p in offered.split(",")]
