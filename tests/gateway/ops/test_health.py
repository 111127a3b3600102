"""The health port: /healthz, /readyz (listeners + hub auth probe + draining), /metrics."""

from __future__ import annotations

import asyncio

import pytest

from tests.gateway.hub.test_frontdoor_harness import (
    HUB_TOKEN,
    Harness,
    get,
    parse_raw,
    running,
    tls,  # noqa: F401
)

pytestmark = pytest.mark.timeout(30)


async def health_get(h: Harness, path: str, method: str = "GET") -> tuple[int, bytes]:
    reader, writer = await asyncio.open_connection("127.0.0.1", h.gateway.health_port)
    writer.write(f"{method} {path} HTTP/1.1\r\nHost: x\r\n\r\n".encode())
    async with asyncio.timeout(5):
        data = await reader.read(-1)
    writer.close()
    status, _, body = parse_raw(data)
    return status, body


async def test_healthz_and_readyz(tls) -> None:  # noqa: F811
    async with running(tls) as h:
        assert await health_get(h, "/healthz") == (200, b"ok\n")
        await h.gateway.readiness.check_once()
        assert await health_get(h, "/readyz") == (200, b"ok\n")
        assert (await health_get(h, "/nope"))[0] == 404
        assert (await health_get(h, "/healthz", "POST"))[0] == 405


async def test_readyz_503_when_hub_cannot_authenticate(tls) -> None:  # noqa: F811
    async with running(tls) as h:
        h.reviewer.down = True
        h.gateway.readiness.hub_ok_at = None
        await h.gateway.readiness.check_once()
        status, body = await health_get(h, "/readyz")
        assert status == 503 and b"hub authentication unavailable" in body
        h.reviewer.down = False
        await h.gateway.readiness.check_once()
        assert (await health_get(h, "/readyz"))[0] == 200


async def test_readyz_503_while_draining_and_new_requests_refused(tls) -> None:  # noqa: F811
    async with running(tls) as h:
        h.connect_cluster("c1")
        await h.gateway.readiness.check_once()
        reader, writer = await h.open()
        await h.gateway.shutdown(timeout=1)
        assert h.gateway.readiness.reason() == "shutting down"
        async with asyncio.timeout(5):
            assert await reader.read(-1) == b""  # idle keep-alive connection closed
        writer.close()


async def test_shutdown_lets_in_flight_request_finish(tls) -> None:  # noqa: F811
    release = asyncio.Event()

    async def slow(stream) -> None:
        await stream.request()
        await release.wait()
        stream.send(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
        stream.send_eof()

    async with running(tls) as h:
        h.connect_cluster("c1", slow)
        reader, writer = await h.open()
        writer.write(get("/c1/api"))
        for _ in range(200):
            if h.streams() and h.streams()[0].eof:
                break
            await asyncio.sleep(0.01)
        shutdown = asyncio.ensure_future(h.gateway.shutdown(timeout=5))
        await asyncio.sleep(0.1)
        assert not shutdown.done()  # waits for the in-flight request
        release.set()
        async with asyncio.timeout(5):
            data = await reader.read(-1)
        assert data.startswith(b"HTTP/1.1 200 OK") and data.endswith(b"ok")
        await asyncio.wait_for(shutdown, 5)
        writer.close()


async def test_metrics_counts_without_identities_or_tokens(tls) -> None:  # noqa: F811
    async with running(tls) as h:
        h.connect_cluster("c1")
        await h.exchange(get("/c1/api", close=True))
        await h.exchange(get("/c1/api", close=True))
        await h.exchange(get("/c1/api", token="bad-token-value", close=True))
        await h.exchange(get("/random-name-123/api", close=True))
        status, body = await health_get(h, "/metrics")
        assert status == 200
        text = body.decode()
        assert 'hubproxy_requests_total{cluster="c1",code="2xx"} 2' in text
        assert 'hubproxy_requests_total{cluster="_other",code="4xx"} 2' in text  # 401, 404
        assert 'hubproxy_requests_by_code_total{code="401"} 1' in text
        assert 'hubproxy_requests_by_code_total{code="404"} 1' in text
        assert "random-name-123" not in text  # unbounded label values are folded
        assert "hubproxy_connected_clusters 1" in text
        assert "hubproxy_connected_agents 1" in text
        assert "hubproxy_auth_cache_hits_total 2" in text  # 2nd c1 + 404 (cached HUB_TOKEN)
        assert "hubproxy_auth_cache_misses_total 2" in text
        assert "hubproxy_active_streams 0" in text
        assert HUB_TOKEN not in text and "bad-token-value" not in text
        assert "alice" not in text


async def test_readyz_stays_200_through_a_hub_outage_once_the_hub_answered(
        tls) -> None:  # noqa: F811
    """Issue 13 (``bench ha``): a hub outage must not take every instance out of the Service
    (refused connections for all); a Ready instance serves cached tokens and 503s the rest."""
    async with running(tls) as h:
        await h.gateway.readiness.check_once()
        assert (await health_get(h, "/readyz"))[0] == 200
        h.reviewer.down = True
        h.gateway.readiness.hub_ok_at -= 3600  # the last success is long past
        await h.gateway.readiness.check_once()
        assert await health_get(h, "/readyz") == (200, b"ok\n")
