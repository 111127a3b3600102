"""The naive aiohttp proxy the gateway benchmark compares with: it must really proxy.

Real sockets and TLS on both sides: an aiohttp upstream, the proxy's app, an aiohttp client.
"""

from __future__ import annotations

import ssl
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
import trustme
from aiohttp import ClientSession, TCPConnector, web
from yarl import URL

from bench.naiveproxy import make_app

BODY = bytes(range(256)) * 4096  # 1 MiB, streamed in pieces


async def upstream_handler(request: web.Request) -> web.StreamResponse:
    if request.path == "/log":
        response = web.StreamResponse(headers={"Content-Type": "text/plain"})
        await response.prepare(request)  # chunked: no length known
        for start in range(0, len(BODY), 65536):
            await response.write(BODY[start:start + 65536])
        await response.write_eof()
        return response
    if request.path == "/echo":
        return web.json_response({"method": request.method, "target": request.raw_path,
                                  "body": (await request.read()).decode(),
                                  "auth": request.headers.get("Authorization")})
    return web.json_response({"kind": "Status", "code": 404}, status=404)


async def start(app: web.Application, ctx: ssl.SSLContext) -> tuple[web.AppRunner, int]:
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0, ssl_context=ctx)
    await site.start()
    return runner, site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]


@pytest.fixture
async def proxied(tmp_path: Path) -> AsyncIterator[tuple[ClientSession, str]]:
    ca = trustme.CA()
    cert = ca.issue_cert("localhost", "127.0.0.1")
    server_ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    cert.configure_cert(server_ctx)
    ca_file = tmp_path / "ca.pem"
    ca.cert_pem.write_to_path(str(ca_file))
    upstream = web.Application()
    upstream.router.add_route("*", "/{tail:.*}", upstream_handler)
    up_runner, up_port = await start(upstream, server_ctx)
    proxy_runner, proxy_port = await start(
        make_app(f"https://127.0.0.1:{up_port}", str(ca_file)), server_ctx)
    client_ctx = ssl.create_default_context(cafile=str(ca_file))
    try:
        async with ClientSession(connector=TCPConnector(ssl=client_ctx)) as client:
            yield client, f"https://127.0.0.1:{proxy_port}"
    finally:
        await proxy_runner.cleanup()
        await up_runner.cleanup()


async def test_streams_a_chunked_body_unchanged(proxied: tuple[ClientSession, str]) -> None:
    client, base = proxied
    async with client.get(f"{base}/log") as response:
        assert response.status == 200
        assert response.headers["Content-Type"].startswith("text/plain")
        assert await response.read() == BODY


async def test_forwards_method_query_body_and_headers(proxied: tuple[ClientSession, str]) -> None:
    client, base = proxied
    async with client.post(URL(f"{base}/echo?watch=1&x=%2F", encoded=True), data=b"hello",
                           headers={"Authorization": "Bearer t"}) as response:
        assert response.status == 200
        assert await response.json() == {"method": "POST", "target": "/echo?watch=1&x=%2F",
                                         "body": "hello", "auth": "Bearer t"}


async def test_passes_the_upstream_status_through(proxied: tuple[ClientSession, str]) -> None:
    client, base = proxied
    async with client.get(f"{base}/missing") as response:
        assert response.status == 404
        assert (await response.json())["code"] == 404
