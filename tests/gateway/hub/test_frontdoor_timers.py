"""The HTTP/1.1 door's one timer per connection (``FrontDoor.arm``): a deadline that moves
later is rescheduled when the timer fires, one that moves earlier moves the timer. Each
deadline fires on time, never early, over real TLS sockets."""

from __future__ import annotations

import asyncio
import time

import pytest

from gateway.hub.config import FrontDoorLimits
from tests.gateway.hub.test_frontdoor_harness import (
    FakeStream,
    get,
    read_response,
    running,
    tls,  # noqa: F401  (fixture)
)

pytestmark = pytest.mark.timeout(30)


async def test_idle_deadline_after_a_shorter_response_deadline_fires_late_enough(
        tls) -> None:  # noqa: F811
    """The response-head deadline (0.3 s) leaves the timer set before the idle one (1.0 s):
    the connection closes when idle, not when the stale timer fires."""
    limits = FrontDoorLimits(idle_timeout=1.0, response_header_timeout=0.3)
    async with running(tls, limits=limits) as h:
        h.connect_cluster("c1")
        reader, writer = await h.open()
        writer.write(get("/c1/api"))
        assert (await read_response(reader))[0] == 200
        answered = time.monotonic()
        async with asyncio.timeout(10):
            assert await reader.read(-1) == b""
        idle = time.monotonic() - answered
        assert 0.9 <= idle < 5, idle
        writer.close()


async def test_keep_alive_requests_move_the_deadlines_without_firing_them(
        tls) -> None:  # noqa: F811
    """Requests every 0.1 s for 1.5 s on a connection whose idle and response deadlines are
    0.4 s: every request is answered, the connection stays open throughout."""
    limits = FrontDoorLimits(idle_timeout=0.4, response_header_timeout=0.4)
    async with running(tls, limits=limits) as h:
        h.connect_cluster("c1")
        reader, writer = await h.open()
        until = time.monotonic() + 1.5
        answered = 0
        while time.monotonic() < until:
            writer.write(get("/c1/api"))
            assert (await read_response(reader))[0] == 200
            answered += 1
            await asyncio.sleep(0.1)
        assert answered >= 5
        writer.close()


async def test_response_deadline_earlier_than_the_idle_one_still_fires(
        tls) -> None:  # noqa: F811
    """A keep-alive connection (idle deadline 20 s pending) whose second request gets no
    response head: 504 after the 0.3 s response deadline, not at the idle one."""
    stalled = asyncio.Event()

    async def second_stalls(stream: FakeStream) -> None:
        await stream.request()
        if stalled.is_set():
            await asyncio.sleep(60)
        stalled.set()
        stream.send(b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n")
        stream.send_eof()

    limits = FrontDoorLimits(idle_timeout=20.0, response_header_timeout=0.3)
    async with running(tls, limits=limits) as h:
        h.connect_cluster("c1", second_stalls)
        reader, writer = await h.open()
        writer.write(get("/c1/api"))
        assert (await read_response(reader))[0] == 200
        await asyncio.sleep(0.2)  # the idle deadline is pending
        sent = time.monotonic()
        writer.write(get("/c1/api"))
        assert (await read_response(reader, timeout=10))[0] == 504
        assert time.monotonic() - sent < 5
        writer.close()
