"""certs.tls over real sockets on 127.0.0.1: required client certs, pinned CAs, hot reload."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import ssl
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from cryptography import x509

from certs import layout
from certs.files import load_issued, write_pair
from certs.issue import issue_agent, issue_server
from certs.tls import (
    TLS1_3,
    ReloadingContext,
    client_context,
    reloading_server_context,
    server_context,
)

HOST = "127.0.0.1"
TIMEOUT = 10.0


@dataclass
class EchoServer:
    """Answers each line with the serial (hex) of the client certificate it saw, then echoes."""

    server: asyncio.Server
    peers: list[int | None] = field(default_factory=list)

    @property
    def port(self) -> int:
        return self.server.sockets[0].getsockname()[1]


async def start_echo(ctx: ssl.SSLContext) -> EchoServer:
    holder: list[EchoServer] = []

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        der = writer.get_extra_info("ssl_object").getpeercert(binary_form=True)
        peer = x509.load_der_x509_certificate(der).serial_number if der else None
        holder[0].peers.append(peer)
        try:
            while line := await reader.readline():
                writer.write(line)
                await writer.drain()
        except (ConnectionError, ssl.SSLError):
            pass
        finally:
            writer.close()

    server = await asyncio.start_server(handle, HOST, 0, ssl=ctx)
    holder.append(EchoServer(server))
    return holder[0]


@pytest.fixture
async def servers() -> AsyncIterator[list[EchoServer]]:
    started: list[EchoServer] = []
    yield started
    for echo in started:
        echo.server.close()
        await echo.server.wait_closed()


async def exchange(port: int, ctx: ssl.SSLContext, server_hostname: str = "localhost") -> tuple[
    bytes, int
]:
    """Connect, send one line, return (answer, served certificate serial)."""
    reader, writer = await asyncio.wait_for(
        asyncio.open_connection(HOST, port, ssl=ctx, server_hostname=server_hostname), TIMEOUT
    )
    try:
        der = writer.get_extra_info("ssl_object").getpeercert(binary_form=True)
        writer.write(b"ping\n")
        await writer.drain()
        answer = await asyncio.wait_for(reader.readline(), TIMEOUT)
        return answer, x509.load_der_x509_certificate(der).serial_number
    finally:
        writer.close()
        with contextlib.suppress(ConnectionError, ssl.SSLError, TimeoutError):
            await asyncio.wait_for(writer.wait_closed(), TIMEOUT)


async def refused(port: int, ctx: ssl.SSLContext) -> bool:
    """True if the server rejected us: handshake failure, or (TLS 1.3, where the server checks
    the client certificate after the client considers the handshake done) no answer."""
    try:
        answer, _ = await exchange(port, ctx)
    except (ssl.SSLError, ConnectionError, asyncio.IncompleteReadError):
        return True
    return answer == b""


def serial_of(path: Path) -> int:
    return x509.load_pem_x509_certificate(path.read_bytes()).serial_number


def tunnel_server(pki: Path, **kwargs) -> ssl.SSLContext:
    d = pki / "tunnel-server"
    return server_context(d / "tls.crt", d / "tls.key", d / "ca.crt", **kwargs)


def agent_client(pki: Path, cluster: str = "c1") -> ssl.SSLContext:
    d = pki / "agents" / cluster
    return client_context(d / "ca.crt", d / "tls.crt", d / "tls.key")


@pytest.mark.parametrize("min_version", [ssl.TLSVersion.TLSv1_2, TLS1_3])
async def test_handshake_with_required_client_cert(pki: Path, servers, min_version) -> None:
    echo = await start_echo(tunnel_server(pki, min_version=min_version))
    servers.append(echo)
    answer, served = await exchange(echo.port, agent_client(pki))
    assert answer == b"ping\n"
    assert served == serial_of(pki / "tunnel-server/tls.crt")
    assert echo.peers == [serial_of(pki / "agents/c1/tls.crt")]


async def test_no_client_cert_is_refused(pki: Path, servers) -> None:
    echo = await start_echo(tunnel_server(pki))
    servers.append(echo)
    no_cert = client_context(pki / "agents/c1/ca.crt")
    assert await refused(echo.port, no_cert)
    assert echo.peers == [], "the server never accepted a connection without a client cert"


async def test_client_cert_from_another_ca_is_refused(pki: Path, other_pki: Path, servers) -> None:
    echo = await start_echo(tunnel_server(pki, min_version=TLS1_3))
    servers.append(echo)
    d = other_pki / "agents/c1"
    foreign = client_context(pki / "agents/c1/ca.crt", d / "tls.crt", d / "tls.key")
    assert await refused(echo.port, foreign)
    assert echo.peers == []


async def test_agent_cert_cannot_serve_and_front_ca_does_not_open_the_tunnel(
    pki: Path, servers
) -> None:
    # The gateway serving cert (front CA) is not trusted by an agent (tunnel CA only).
    g = pki / "gateway"
    echo = await start_echo(server_context(g / "tls.crt", g / "tls.key", None))
    servers.append(echo)
    with pytest.raises(ssl.SSLCertVerificationError):
        await exchange(echo.port, agent_client(pki))
    # ...but it is trusted by a user who pins the front CA, with no client cert needed.
    answer, _ = await exchange(echo.port, client_context(g / "ca.crt"), "127.0.0.1")
    assert answer == b"ping\n"


def test_client_context_trusts_only_the_given_ca(pki: Path) -> None:
    ctx = agent_client(pki)
    stats = ctx.cert_store_stats()
    assert stats["x509_ca"] == 1 and stats["x509"] == 1
    assert ctx.check_hostname and ctx.verify_mode == ssl.CERT_REQUIRED
    assert ctx.minimum_version >= ssl.TLSVersion.TLSv1_2


def test_server_context_requires_client_cert_only_with_a_ca(pki: Path) -> None:
    assert tunnel_server(pki).verify_mode == ssl.CERT_REQUIRED
    g = pki / "gateway"
    assert server_context(g / "tls.crt", g / "tls.key", None).verify_mode == ssl.CERT_NONE
    only13 = tunnel_server(pki, min_version=TLS1_3)
    assert only13.minimum_version == TLS1_3


async def test_tls13_only_server_refuses_tls12_client(pki: Path, servers) -> None:
    echo = await start_echo(tunnel_server(pki, min_version=TLS1_3))
    servers.append(echo)
    old = agent_client(pki)
    old.maximum_version = ssl.TLSVersion.TLSv1_2
    with pytest.raises((ssl.SSLError, ConnectionError)):
        await exchange(echo.port, old)
    assert echo.peers == []


def reissue_tunnel_server(pki: Path) -> int:
    ca = load_issued(pki / "tunnel-ca/ca.crt", pki / "tunnel-ca/ca.key")
    issued = issue_server(ca, layout.TUNNEL_SERVER_CN, ["localhost", "127.0.0.1"], days=1)
    write_pair(pki / "tunnel-server", issued, ca.cert, force=True)
    return issued.cert.serial_number


async def test_running_server_picks_up_a_replaced_certificate(
    tmp_path: Path, servers, caplog: pytest.LogCaptureFixture
) -> None:
    layout.init(tmp_path, layout.InitOptions(clusters=["c1"]))
    d = tmp_path / "tunnel-server"
    reloading = ReloadingContext(
        lambda: server_context(d / "tls.crt", d / "tls.key", d / "ca.crt", min_version=TLS1_3),
        [d / "tls.crt", d / "tls.key", d / "ca.crt"],
        check_interval=0.0,
    )
    echo = await start_echo(reloading_server_context(reloading))
    servers.append(echo)
    client = agent_client(tmp_path)

    _, before = await exchange(echo.port, client)
    _, before_ip = await exchange(echo.port, client, "127.0.0.1")
    assert before_ip == before
    assert before == serial_of(d / "tls.crt")

    # An open connection survives the swap; new connections get the new certificate.
    reader, writer = await asyncio.open_connection(
        HOST, echo.port, ssl=client, server_hostname="localhost"
    )
    new_serial = reissue_tunnel_server(tmp_path)
    _, after = await exchange(echo.port, client)
    assert after == new_serial != before
    # Clients that connect by IP send no SNI; the switch happens for them too.
    _, by_ip = await exchange(echo.port, client, "127.0.0.1")
    assert by_ip == new_serial
    assert reloading.generation == 1
    writer.write(b"still here\n")
    assert await asyncio.wait_for(reader.readline(), TIMEOUT) == b"still here\n"
    writer.close()

    # A broken replacement is refused: the last good certificate keeps being served.
    caplog.set_level(logging.WARNING, logger="certs.tls")
    (d / "tls.key").write_text("-----BEGIN PRIVATE KEY-----\ngarbage\n-----END PRIVATE KEY-----\n")
    _, still = await exchange(echo.port, client)
    assert still == new_serial
    assert reloading.last_error is not None
    assert "keeping the previous certificates" in caplog.text
    assert "garbage" not in caplog.text, "key file content is never logged"
    assert reloading.generation == 1


async def test_client_reload_presents_the_new_agent_certificate(tmp_path: Path, servers) -> None:
    layout.init(tmp_path, layout.InitOptions(clusters=["c1"]))
    echo = await start_echo(tunnel_server(tmp_path))
    servers.append(echo)
    a = tmp_path / "agents/c1"
    reloading = ReloadingContext(
        lambda: client_context(a / "ca.crt", a / "tls.crt", a / "tls.key"),
        [a / "ca.crt", a / "tls.crt", a / "tls.key"],
        check_interval=0.0,
    )
    await exchange(echo.port, reloading.current())
    ca = load_issued(tmp_path / "tunnel-ca/ca.crt", tmp_path / "tunnel-ca/ca.key")
    renewed = issue_agent(ca, "c1", days=1)
    write_pair(a, renewed, ca.cert, force=True)
    await exchange(echo.port, reloading.current())
    assert len(echo.peers) == 2
    assert echo.peers[1] == renewed.cert.serial_number != echo.peers[0]


def test_reloading_context_checks_at_most_every_interval(tmp_path: Path) -> None:
    layout.init(tmp_path, layout.InitOptions())
    d = tmp_path / "tunnel-server"
    builds: list[int] = []

    def build() -> ssl.SSLContext:
        builds.append(1)
        return server_context(d / "tls.crt", d / "tls.key", d / "ca.crt")

    reloading = ReloadingContext(build, [d / "tls.crt", d / "tls.key"], check_interval=3600)
    first = reloading.current()
    reissue_tunnel_server(tmp_path)
    assert reloading.current() is first, "no stat before the interval has passed"
    assert reloading.check_now() is True
    assert reloading.current() is not first
    assert len(builds) == 2
    assert reloading.check_now() is False, "unchanged files are not rebuilt"


def test_first_build_must_succeed(tmp_path: Path) -> None:
    missing = tmp_path / "nope.crt"
    with pytest.raises((OSError, ssl.SSLError)):
        ReloadingContext(lambda: server_context(missing, missing, None), [missing])
