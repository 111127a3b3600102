"""The HTTP/2 door's deadlines (``H2FrontDoor.wake_at``): each stream's (the response head's,
a stalled body's) and the connection's idle one are numbers on the connection's one loop
timer, which moves only when a deadline comes earlier. Each still fires on time, never early,
over real TLS sockets; steady traffic makes no loop timer per request."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import pytest

from gateway.hub.config import FrontDoorLimits
from gateway.hub.exchange import Exchange
from gateway.hub.frontdoor_h2 import H2FrontDoor, H2Stream
from gateway.hub.wakeup import Wakeup
from tests.gateway.hub.h2client import H2Client
from tests.gateway.hub.test_frontdoor_harness import (
    HUB_TOKEN,
    FakeStream,
    echo_agent,
    h2tls,  # noqa: F401  (fixture)
    running,
    tls,  # noqa: F401  (fixture)
)

pytestmark = pytest.mark.timeout(30)


async def test_a_response_head_that_never_comes_is_504_on_time_and_others_flow(
        h2tls) -> None:  # noqa: F811
    """One stream's agent never answers: it gets 504 after --response-header-timeout (not
    before), while requests on other streams of the same connection are answered meanwhile
    and their later deadlines do not hold its deadline back."""
    limits = FrontDoorLimits(response_header_timeout=0.6, idle_timeout=5.0)

    async def agent(stream: FakeStream) -> None:
        _head, _ = await stream.request()
        if b"/silent" in bytes(stream.received):
            await asyncio.sleep(10)  # never answers in time
            return
        await echo_agent(stream)

    async with running(h2tls, limits=limits) as h:
        h.connect_cluster("c1", agent)
        c = await H2Client.connect(h.port, h.tls.ca_file)
        try:
            started = time.monotonic()
            silent = c.start("/c1/silent", token=HUB_TOKEN)
            for _ in range(5):  # later deadlines, each answered well before its own
                r = await c.request("/c1/api", token=HUB_TOKEN)
                assert r.status == 200
                await asyncio.sleep(0.05)
            r = await c.wait(silent, timeout=5)
            waited = time.monotonic() - started
            assert r.status == 504
            assert 0.55 <= waited < 3, waited
            r = await c.request("/c1/api", token=HUB_TOKEN)  # the connection carries on
            assert r.status == 200
        finally:
            await c.close()


async def test_an_idle_connection_closes_after_its_deadline_not_a_streams(
        h2tls) -> None:  # noqa: F811
    """The response-head deadline (0.3 s) leaves the connection's timer set before the idle
    one (1.0 s): the connection closes when idle for 1.0 s, not when that timer fires."""
    limits = FrontDoorLimits(response_header_timeout=0.3, idle_timeout=1.0)
    async with running(h2tls, limits=limits) as h:
        h.connect_cluster("c1")
        c = await H2Client.connect(h.port, h.tls.ca_file)
        try:
            assert (await c.request("/c1/api", token=HUB_TOKEN)).status == 200
            answered = time.monotonic()
            async with asyncio.timeout(10):
                await c.closed.wait()
            idle = time.monotonic() - answered
            assert 0.9 <= idle < 5, idle
            assert c.goaway is not None and c.goaway.error_code == 0
        finally:
            await c.close()


async def test_steady_requests_make_no_loop_timer_each(h2tls, monkeypatch) -> None:  # noqa: F811
    """Twenty requests one after another on one connection: the door's deadlines (the
    response head's, and idle between requests) move the connection's timer at most twice,
    where a timer per stream and one per idle spell made forty."""
    loop = asyncio.get_running_loop()
    timers: list[Any] = []
    call_at = loop.call_at

    def counting_call_at(when: float, callback: Any, *args: Any, **kwargs: Any) -> Any:
        owner = getattr(callback, "__self__", None)
        if isinstance(owner, (H2FrontDoor, H2Stream, Exchange, Wakeup)):
            timers.append(callback)
        return call_at(when, callback, *args, **kwargs)

    monkeypatch.setattr(loop, "call_at", counting_call_at)
    limits = FrontDoorLimits(response_header_timeout=30.0, idle_timeout=60.0)
    async with running(h2tls, limits=limits) as h:
        h.connect_cluster("c1")
        c = await H2Client.connect(h.port, h.tls.ca_file)
        try:
            for _ in range(20):
                assert (await c.request("/c1/api", token=HUB_TOKEN)).status == 200
        finally:
            await c.close()
    assert 1 <= len(timers) <= 3, timers
