"""The front door over HTTP/2 (gateway.hub.frontdoor_h2), with a raw ``h2`` client over real
TLS against the in-process gateway harness (fake tunnel sessions)."""

from __future__ import annotations

import json
import ssl
from collections.abc import AsyncIterator

import pytest

from tests.gateway.hub.h2client import H2Client
from tests.gateway.hub.test_frontdoor_harness import (
    HUB_TOKEN,
    Harness,
    Tls,
    running,
    tls,  # noqa: F401 - the session fixture
)


@pytest.fixture(scope="module")
def h2tls(tls: Tls) -> Tls:  # noqa: F811
    # The harness' server context, offering h2 like front_tls does in production.
    server = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    server.minimum_version = ssl.TLSVersion.TLSv1_2
    tls.ca.issue_cert("localhost", "127.0.0.1").configure_cert(server)
    server.set_alpn_protocols(["h2", "http/1.1"])
    return Tls(tls.ca, server, tls.client, tls.ca_file)


@pytest.fixture
async def gw(h2tls: Tls) -> AsyncIterator[Harness]:
    async with running(h2tls) as harness:
        harness.connect_cluster("c1")
        yield harness


@pytest.fixture
async def client(gw: Harness) -> AsyncIterator[H2Client]:
    c = await H2Client.connect(gw.port, gw.tls.ca_file)
    yield c
    await c.close()


async def test_get_through_h2(gw: Harness, client: H2Client) -> None:
    r = await client.request("/c1/api/v1/namespaces/default/pods?limit=1", token=HUB_TOKEN)
    assert r.status == 200 and r.ended
    echoed = json.loads(r.body)
    assert echoed["method"] == "GET"
    assert echoed["target"] == "/api/v1/namespaces/default/pods?limit=1"
    names = [n.lower() for n, _ in echoed["headers"]]
    assert "authorization" not in names
    assert ["host", "localhost"] in [[n.lower(), v] for n, v in echoed["headers"]]
