"""One long-running rule at both front doors (issue 25): what kube-apiserver watches or follows
(``gateway.wire.requestclass``) takes a stream slot, waits for its response head past the
response-header timeout and is audited as a stream; whatever it does not, none of that."""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import AsyncIterator

import pytest

from gateway.hub.config import FrontDoorLimits
from gateway.ops import audit
from tests.gateway.hub.h2client import H2Client
from tests.gateway.hub.test_frontdoor_harness import (
    HUB_TOKEN,
    FakeStream,
    Harness,
    Tls,
    get,
    h2tls,  # noqa: F401 - the session fixture
    running,
    status_of,
    tls,  # noqa: F401 - the session fixture
)

pytestmark = pytest.mark.timeout(30)

COLLECTION = "/c1/api/v1/namespaces/d/pods"
HEAD_DELAY = 0.6  # the agent's delay before a watch's head, past the response-header timeout


async def slow_watch(stream: FakeStream) -> None:
    """Every request gets a chunked 200 with one event, after HEAD_DELAY, and stays open."""
    await stream.request()
    await asyncio.sleep(HEAD_DELAY)
    stream.send(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
                b"Transfer-Encoding: chunked\r\n\r\n11\r\n{\"type\":\"ADDED\"}\n\r\n")
    await stream.wait(lambda: stream.closed, timeout=20)


@pytest.fixture
async def gw(h2tls: Tls) -> AsyncIterator[Harness]:  # noqa: F811
    async with running(h2tls, limits=FrontDoorLimits(response_header_timeout=0.2),
                       max_streams_per_identity=1) as harness:
        harness.connect_cluster("c1", slow_watch)
        yield harness


async def status_over_h1(gw: Harness, path: str) -> int:
    reader, writer = await gw.open()
    try:
        writer.write(get(path))
        async with asyncio.timeout(5):
            head = await reader.readuntil(b"\r\n\r\n")
        return int(head.split(b" ")[1])
    finally:
        writer.close()


async def status_over_h2(gw: Harness, path: str) -> int:
    client = await H2Client.connect(gw.port, gw.tls.ca_file)
    try:
        sid = client.start(path, token=HUB_TOKEN)
        return (await client.wait(sid, lambda r: r.status or r.reset is not None)).status
    finally:
        await client.close()


@pytest.mark.parametrize("status_of_request", [status_over_h1, status_over_h2],
                         ids=["h1", "h2"])
@pytest.mark.parametrize(("query", "watch"), [
    ("?watch=t", True), ("?watch=yes", True), ("?watch=", True), ("?wat%63h=1", True),
    ("?watch=false&watch=true", False), ("?watch=fals%65", False),
])
async def test_a_watch_waits_for_its_head_and_a_list_does_not(
        gw: Harness, status_of_request: object, query: str, watch: bool) -> None:
    """A watch may be held before its head (no response-header timeout); what kube-apiserver
    serves as a list is a short request: 504 once the head is late."""
    status = await status_of_request(gw, COLLECTION + query)  # type: ignore[operator]
    assert status == (200 if watch else 504)


async def test_rule7_every_spelling_of_a_watch_counts_against_the_cap(gw: Harness) -> None:
    """``wat%63h=1``, ``watch=yes``, ``watch=`` and an encoded legacy watch path are watches to
    kube-apiserver: with one watch open, each is the identity's second (429), never a way past
    the cap."""
    reader, writer = await gw.open()
    writer.write(get(COLLECTION + "?watch=true"))
    async with asyncio.timeout(5):
        assert (await reader.readuntil(b"\r\n\r\n")).startswith(b"HTTP/1.1 200")
    for path in (COLLECTION + "?wat%63h=1", COLLECTION + "?watch=yes", COLLECTION + "?watch=",
                 "/c1/api/v1/w%61tch/namespaces/d/pods"):
        status, obj = status_of(await gw.exchange(get(path, close=True)))
        assert status == 429 and "limit 1" in obj["message"], path
    assert len(gw.streams()) == 1  # none of them reached the cluster
    writer.close()


async def test_only_what_kube_apiserver_watches_is_audited_as_a_stream(
        gw: Harness, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger=audit.AUDIT_LOGGER)
    gw.gateway.audit_trail.lines = True
    for query in ("?watch=0", "?watch=no"):
        reader, writer = await gw.open()
        writer.write(get(COLLECTION + query))
        async with asyncio.timeout(5):
            await reader.readuntil(b"\r\n\r\n")  # 504 for the list, 200 for the watch
        writer.close()
    async with asyncio.timeout(5):
        while sum('"event"' in r.getMessage() for r in caplog.records) < 3:
            await asyncio.sleep(0.02)
    events = [(json.loads(r.getMessage())["event"], json.loads(r.getMessage())["path"])
              for r in caplog.records if r.name == audit.AUDIT_LOGGER]
    assert ("request", COLLECTION + "?watch=0") in events
    assert ("stream_start", COLLECTION + "?watch=no") in events
    assert not any(event.startswith("stream") and path.endswith("watch=0")
                   for event, path in events)
