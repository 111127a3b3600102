"""A watch whose response head is still on its way when its agent session announces DRAIN (or
when the gateway starts shutting down) ends cleanly once the head is out, over HTTP/1.1 and
HTTP/2. ``bench ha`` found it: under load one watch in a hundred had its OPEN accepted by the
agent just before the agent's SIGTERM, so the DRAIN reached the gateway before the watch's
head, ``end_follow`` found nothing streaming to end, and the watch was cut with a truncated
body at the agent's drain deadline. Ending it inside ``response_started`` is no better: the
last chunk would reach the client before the head."""

from __future__ import annotations

import asyncio

import pytest

from gateway.wire.http2 import chunk
from tests.gateway.hub.h2client import H2Client
from tests.gateway.hub.test_frontdoor_harness import (
    HUB_TOKEN,
    Agent,
    FakeStream,
    Harness,
    Tls,
    get,
    h2tls,  # noqa: F401 - the session fixture
    read_response,
    running,
    tls,  # noqa: F401 - the session fixture
)
from tests.support import eventually

WATCH = "/c1/api/v1/namespaces/default/configmaps?watch=1"
EVENT = b'{"type":"ADDED","object":{"kind":"ConfigMap"}}\n'
CHUNKED_HEAD = (b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
                b"Transfer-Encoding: chunked\r\n\r\n")


def head_after(release: asyncio.Event) -> Agent:
    """Takes the watch, answers its head and a first event only once ``release`` is set, then
    holds it open (as an apiserver does) until the gateway resets it."""

    async def agent(stream: FakeStream) -> None:
        await stream.request()
        await release.wait()
        stream.send(CHUNKED_HEAD + chunk(EVENT))
        await stream.wait(lambda: stream.closed, timeout=30)

    return agent


async def leave(harness: Harness, who: str, release: asyncio.Event) -> None:
    await eventually(lambda: harness.streams("c1"), timeout=5)
    if who == "agent":
        harness.sessions["c1"].draining = True  # the agent's DRAIN arrived before the head
    else:
        harness.gateway.draining = True  # shutdown began before the head
    release.set()


@pytest.mark.parametrize("who", ["agent", "gateway"])
async def test_watch_started_while_leaving_ends_cleanly_over_h1(h2tls: Tls, who: str) -> None:  # noqa: F811
    release = asyncio.Event()
    async with running(h2tls) as harness:
        harness.connect_cluster("c1", head_after(release))
        reader, writer = await harness.open()
        try:
            writer.write(get(WATCH))
            await leave(harness, who, release)
            # The head first, the event, then the last chunk: a complete response, at once.
            status, headers, body = await read_response(reader, timeout=3)
            assert status == 200 and headers["transfer-encoding"] == "chunked"
            assert body == EVENT
            stream = harness.streams("c1")[0]
            await stream.wait(lambda: stream.closed, timeout=3)  # upstream watch cancelled
            assert stream.reset_code is not None
        finally:
            writer.close()


@pytest.mark.parametrize("who", ["agent", "gateway"])
async def test_watch_started_while_leaving_ends_cleanly_over_h2(h2tls: Tls, who: str) -> None:  # noqa: F811
    release = asyncio.Event()
    async with running(h2tls) as harness:
        harness.connect_cluster("c1", head_after(release))
        client = await H2Client.connect(harness.port, harness.tls.ca_file)
        try:
            sid = client.start(WATCH, token=HUB_TOKEN)
            await leave(harness, who, release)
            response = await client.wait(sid, timeout=3)
            assert response.status == 200
            assert response.ended and response.reset is None  # END_STREAM, not a reset
            assert bytes(response.body) == EVENT
            stream = harness.streams("c1")[0]
            await stream.wait(lambda: stream.closed, timeout=3)
            assert stream.reset_code is not None
        finally:
            await client.close()
