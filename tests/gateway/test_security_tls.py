"""TLS of the gateway's listeners as app.py builds them from a `hubproxy certs init` layout.

Rule 4/6: the tunnel accepts only TLS 1.3 clients with a certificate from --agent-ca (fail
closed); the front door speaks TLS >= 1.2 with the front CA's certificate and picks up a
rotated certificate without a restart.
"""

from __future__ import annotations

import asyncio
import shutil
import ssl
from pathlib import Path

import pytest

from certs import layout
from gateway.hub.app import front_tls, tunnel_tls
from gateway.hub.config import GatewayConfig

pytestmark = pytest.mark.timeout(30)


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("pki")
    layout.init(root, layout.InitOptions(clusters=["c1"]))
    return root


def config(pki: Path, tls_dir: Path | None = None) -> GatewayConfig:
    return GatewayConfig(tls_dir=str(tls_dir or pki / "gateway"),
                         tunnel_tls_dir=str(pki / "tunnel-server"),
                         agent_ca=str(pki / "tunnel-ca" / "ca.crt"))


async def serve(ctx: ssl.SSLContext) -> tuple[asyncio.base_events.Server, int]:
    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        writer.write(b"ok")
        await writer.drain()
        writer.close()

    server = await asyncio.start_server(handle, "127.0.0.1", 0, ssl=ctx)
    return server, server.sockets[0].getsockname()[1]


async def handshake(port: int, ctx: ssl.SSLContext) -> tuple[bytes, str | None, bytes]:
    reader, writer = await asyncio.open_connection("127.0.0.1", port, ssl=ctx,
                                                   server_hostname="localhost")
    ssl_object = writer.get_extra_info("ssl_object")
    alpn = ssl_object.selected_alpn_protocol()
    peer = ssl_object.getpeercert(binary_form=True)
    data = await asyncio.wait_for(reader.read(), 5)
    writer.close()
    return data, alpn, peer


def agent_client(pki: Path, cert_dir: Path | None, *, max_version=None) -> ssl.SSLContext:
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    ctx.load_verify_locations(str(pki / "tunnel-ca" / "ca.crt"))
    ctx.set_alpn_protocols(["hubproxy-tunnel/1"])
    if cert_dir is not None:
        ctx.load_cert_chain(str(cert_dir / "tls.crt"), str(cert_dir / "tls.key"))
    if max_version is not None:
        ctx.maximum_version = max_version
    return ctx


async def test_tunnel_accepts_an_agent_certificate_with_tls13_and_alpn(pki: Path) -> None:
    server, port = await serve(tunnel_tls(config(pki)))
    try:
        data, alpn, _ = await handshake(port, agent_client(pki, pki / "agents" / "c1"))
        assert data == b"ok" and alpn == "hubproxy-tunnel/1"
    finally:
        server.close()


@pytest.mark.parametrize("case", ["no-client-cert", "cert-from-front-ca", "tls12"])
async def test_rule6_tunnel_refuses_agents_without_a_tunnel_ca_certificate(
        pki: Path, tmp_path: Path, case: str) -> None:
    if case == "no-client-cert":
        ctx = agent_client(pki, None)
    elif case == "cert-from-front-ca":
        ctx = agent_client(pki, pki / "gateway")  # a valid cert, but not from --agent-ca
    else:
        ctx = agent_client(pki, pki / "agents" / "c1", max_version=ssl.TLSVersion.TLSv1_2)
    server, port = await serve(tunnel_tls(config(pki)))
    try:
        with pytest.raises((ssl.SSLError, ConnectionError, asyncio.IncompleteReadError)):
            data, _, _ = await handshake(port, ctx)
            if not data:  # TLS 1.3: the client learns of the refusal on its first read
                raise ConnectionError("refused after the handshake")
    finally:
        server.close()


async def test_front_door_certificate_is_reloaded_without_restart(pki: Path,
                                                                  tmp_path: Path) -> None:
    tls_dir = tmp_path / "front"
    shutil.copytree(pki / "gateway", tls_dir)
    server, port = await serve(front_tls(config(pki, tls_dir)))
    client = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    client.load_verify_locations(str(pki / "front-ca" / "ca.crt"))
    try:
        _, _, first = await handshake(port, client)
        other = tmp_path / "other"
        layout.init(other, layout.InitOptions(clusters=[]))
        # A fresh layout has its own front CA: trust it too, rotate the files underneath the
        # running server (key first, atomically), and expect the new leaf on new connections.
        client.load_verify_locations(str(other / "front-ca" / "ca.crt"))
        shutil.copy(other / "gateway" / "tls.key", tls_dir / "tls.key.new")
        shutil.copy(other / "gateway" / "tls.crt", tls_dir / "tls.crt")
        (tls_dir / "tls.key.new").replace(tls_dir / "tls.key")
        for _ in range(60):
            await asyncio.sleep(0.1)
            _, _, peer = await handshake(port, client)
            if peer != first:
                break
        assert peer != first
    finally:
        server.close()
