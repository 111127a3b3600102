"""The floor the gateway benchmark measures (bench.hopfloor) must really relay, hop after hop.

Real sockets and TLS everywhere: an aiohttp upstream, two hops in series as the bench runs them,
an aiohttp client keeping its connection alive across responses of both framings.
"""

from __future__ import annotations

import ssl
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
import trustme
from aiohttp import ClientSession, TCPConnector, web

from bench.hopfloor import ChunkedEnd, start

BODY = bytes(range(256)) * 4096  # 1 MiB


async def upstream_handler(request: web.Request) -> web.StreamResponse:
    if request.path == "/chunked":
        response = web.StreamResponse()
        await response.prepare(request)  # no length known: chunked
        for at in range(0, len(BODY), 65536):
            await response.write(BODY[at:at + 65536])
        await response.write_eof()
        return response
    size = int(request.query.get("size", "10"))
    return web.Response(body=BODY[:size], headers={"X-Path": request.path_qs})


@pytest.fixture
async def through_two_hops(tmp_path: Path) -> AsyncIterator[tuple[ClientSession, str]]:
    ca = trustme.CA()
    cert = ca.issue_cert("127.0.0.1")
    cert_file, key_file, ca_file = (tmp_path / n for n in ("tls.crt", "tls.key", "ca.crt"))
    cert.cert_chain_pems[0].write_to_path(str(cert_file))
    cert.private_key_pem.write_to_path(str(key_file))
    ca.cert_pem.write_to_path(str(ca_file))
    server_ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    cert.configure_cert(server_ctx)
    app = web.Application()
    app.router.add_get("/{tail:.*}", upstream_handler)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0, ssl_context=server_ctx)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    hops = []
    for _ in range(2):  # the apiserver's side first, as the bench starts them
        hop = await start(("127.0.0.1", 0), str(cert_file), str(key_file), ("127.0.0.1", port),
                          str(ca_file))
        hops.append(hop)
        port = hop.sockets[0].getsockname()[1]
    client_ctx = ssl.create_default_context(cafile=str(ca_file))
    try:
        async with ClientSession(connector=TCPConnector(ssl=client_ctx, limit=1)) as client:
            yield client, f"https://127.0.0.1:{port}"
    finally:
        for hop in hops:
            hop.close()
        await runner.cleanup()


async def test_relays_both_framings_on_one_kept_connection(
        through_two_hops: tuple[ClientSession, str]) -> None:
    client, base = through_two_hops
    for path, want in (("/a?size=10", BODY[:10]), ("/chunked", BODY),
                       ("/b?size=300000", BODY[:300000]), ("/c?size=0", b""),
                       ("/chunked", BODY), ("/d?size=7", BODY[:7])):
        async with client.get(base + path) as response:
            assert response.status == 200
            assert await response.read() == want
            if "size" in path:
                assert response.headers["X-Path"] == path


@pytest.mark.parametrize("cut", range(0, 30))
def test_chunked_end_is_found_however_the_body_is_cut(cut: int) -> None:
    body = b"5\r\nhello\r\n3;ext=1\r\nabc\r\n0\r\n\r\n"
    tracker = ChunkedEnd()
    tracker.feed(body[:cut])
    assert tracker.done is (cut >= len(body) - 2)  # its last CRLF is not waited for
    tracker.feed(body[cut:])
    assert tracker.done
