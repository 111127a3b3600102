"""The hub half of the "relay only" configuration: TCP in, tunnel stream out, no HTTP.

    python -m bench.relayhub --listen 127.0.0.1:P --tunnel-listen 127.0.0.1:T --pki DIR \
        --cluster relay --target 127.0.0.1:UPSTREAM

Each TCP connection accepted on ``--listen`` becomes one ``TCPTarget`` stream on the cluster's
tunnel session (the production ``start_tunnel_listener`` + ``SessionRegistry``, mTLS 1.3 with the
certificates of ``hubproxy certs init``); the production ``hubproxy agent --allow-tcp`` relays it
to the upstream. The client speaks TLS end to end with the upstream through it, so the figure
against "direct" is exactly what the tunnel framing (and its second TLS layer) costs. Prints
``relayhub ready`` once the agent's session is registered.
"""

from __future__ import annotations

import argparse
import asyncio
import signal
import sys
import time
from pathlib import Path
from typing import Any

from certs.tls import TLS1_3, server_context
from tunnel.connection import ALPN, SessionConfig
from tunnel.errors import ResetCode
from tunnel.listener import start_tunnel_listener
from tunnel.registry import SessionRegistry
from tunnel.targets import TCPTarget


class ClientRelay(asyncio.Protocol):
    """One client TCP connection <-> one tunnel stream, back-pressure and half-close both ways."""

    def __init__(self, registry: SessionRegistry, cluster: str, target: TCPTarget) -> None:
        self.registry = registry
        self.cluster = cluster
        self.target = target
        self.client: asyncio.Transport | None = None
        self.stream: Any = None

    # client side (asyncio.Protocol)
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.client = transport  # type: ignore[assignment]
        session = self.registry.pick(self.cluster)
        if session is None:
            transport.close()
            return
        session.open_stream(self.target, b"", _StreamSide(self))

    def data_received(self, data: bytes) -> None:
        if self.stream is not None:
            self.stream.write(data)

    def eof_received(self) -> bool:
        if self.stream is not None:
            self.stream.write_eof()
        return True  # keep our sending direction open for the rest of the response

    def connection_lost(self, exc: BaseException | None) -> None:
        if self.stream is not None and not self.stream.is_closing():
            self.stream.reset(ResetCode.CANCEL)

    def pause_writing(self) -> None:
        if self.stream is not None:
            self.stream.pause_reading()

    def resume_writing(self) -> None:
        if self.stream is not None:
            self.stream.resume_reading()


class _StreamSide:
    """The tunnel stream's StreamProtocol, delegating to the client relay."""

    def __init__(self, relay: ClientRelay) -> None:
        self.relay = relay

    def connection_made(self, stream: Any) -> None:
        self.relay.stream = stream

    def data_received(self, data: bytes | memoryview) -> None:
        self.relay.client.write(bytes(data))  # a stream's memoryview must not be kept

    def eof_received(self) -> None:
        if self.relay.client.can_write_eof():
            self.relay.client.write_eof()

    def connection_lost(self, exc: BaseException | None) -> None:
        self.relay.client.close()

    def pause_writing(self) -> None:
        self.relay.client.pause_reading()

    def resume_writing(self) -> None:
        self.relay.client.resume_reading()


def _hostport(text: str) -> tuple[str, int]:
    host, _, port = text.rpartition(":")
    return host, int(port)


async def serve(args: argparse.Namespace) -> None:
    pki = Path(args.pki)
    registry = SessionRegistry()
    ctx = server_context(pki / "tunnel-server/tls.crt", pki / "tunnel-server/tls.key",
                         pki / "tunnel-ca/ca.crt", min_version=TLS1_3, alpn_protocols=[ALPN])
    host, port = _hostport(args.tunnel_listen)
    listener = await start_tunnel_listener(host, port, ctx, registry, SessionConfig())
    target = TCPTarget(*_hostport(args.target))
    loop = asyncio.get_running_loop()
    host, port = _hostport(args.listen)
    server = await loop.create_server(lambda: ClientRelay(registry, args.cluster, target),
                                      host, port, backlog=4096)
    deadline = time.monotonic() + args.wait_agent
    while registry.pick(args.cluster) is None:
        if time.monotonic() > deadline:
            raise SystemExit(f"relayhub: no agent for {args.cluster} within {args.wait_agent}s")
        await asyncio.sleep(0.05)
    print("relayhub ready", flush=True)
    stop = loop.create_future()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set_result, None)
    await stop
    server.close()
    listener.close()
    await listener.wait_closed()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.relayhub",
                                     description=__doc__.split("\n")[0])
    parser.add_argument("--listen", required=True, metavar="HOST:PORT")
    parser.add_argument("--tunnel-listen", required=True, metavar="HOST:PORT")
    parser.add_argument("--pki", required=True, help="a `hubproxy certs init` directory")
    parser.add_argument("--cluster", default="relay")
    parser.add_argument("--target", required=True, metavar="HOST:PORT")
    parser.add_argument("--wait-agent", type=float, default=60.0)
    args = parser.parse_args(argv)
    try:
        import uvloop
        factory = uvloop.new_event_loop
    except ImportError:
        factory = None
    with asyncio.Runner(loop_factory=factory) as runner:
        runner.run(serve(args))
    return 0


if __name__ == "__main__":
    sys.exit(main())
