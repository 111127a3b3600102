"""Fair queuing of short requests between identities, through real TLS sockets (HTTP/1.1 and
HTTP/2): one identity flooding the gateway does not starve another; full queues and long waits
are 429 with ``Retry-After``; long-running requests take no seat."""

from __future__ import annotations

import asyncio
import contextlib
import json
import ssl
from collections.abc import AsyncIterator
from typing import Any

import pytest

from tests.gateway.hub.h2client import H2Client
from tests.gateway.hub.test_frontdoor_harness import (
    HUB_TOKEN,
    OTHER_TOKEN,
    FakeStream,
    Harness,
    Tls,
    get,
    read_response,
    running,
    tls,  # noqa: F401 - fixture
)
from tests.support import eventually


@pytest.fixture(scope="module")
def fair_tls(tls: Tls) -> Tls:  # noqa: F811
    """The harness' server context, offering h2 like the production front door."""
    server = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    server.minimum_version = ssl.TLSVersion.TLSv1_2
    tls.ca.issue_cert("localhost", "127.0.0.1").configure_cert(server)
    server.set_alpn_protocols(["h2", "http/1.1"])
    return Tls(tls.ca, server, tls.client, tls.ca_file)


ALICE = "system:serviceaccount:team:alice"  # HUB_TOKEN's user: the flood
BOB = "bob"  # OTHER_TOKEN's user


class HeldAgent:
    """Answers bob at once; holds each of alice's requests until the test lets one go."""

    def __init__(self) -> None:
        self.order: list[str] = []  # users, in the order their requests reached the cluster
        self.release = asyncio.Semaphore(0)

    async def __call__(self, stream: FakeStream) -> None:
        await stream.request()
        user = json.loads(stream.metadata)["user"]
        self.order.append(user)
        if user.endswith(ALICE):
            await self.release.acquire()
        body = json.dumps({"user": user}).encode()
        stream.send(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
                    b"Content-Length: %d\r\n\r\n%s" % (len(body), body))
        stream.send_eof()


@contextlib.asynccontextmanager
async def gateway(server_tls: Tls, **fair: Any) -> AsyncIterator[tuple[Harness, HeldAgent]]:
    agent = HeldAgent()
    async with running(server_tls, **fair) as h:
        h.connect_cluster("c1", agent)
        try:
            yield h, agent
        finally:
            for _ in range(64):  # let every held request end, so nothing leaks
                agent.release.release()


async def h1_request(h: Harness, token: str, path: str = "/c1/api/v1/pods"
                     ) -> tuple[int, dict[str, str], bytes]:
    reader, writer = await h.open()
    try:
        writer.write(get(path, token, close=True))
        return await read_response(reader, timeout=10)
    finally:
        writer.close()


async def test_rule7_a_flooding_identity_does_not_starve_another_over_h1(fair_tls: Tls) -> None:
    async with gateway(fair_tls, max_executing_requests=2) as (h, agent):
        seats = h.gateway.seats
        assert seats is not None
        flood = [asyncio.create_task(h1_request(h, HUB_TOKEN)) for _ in range(8)]
        await eventually(lambda: seats.executing == 2 and seats.waiting == 6)
        bob = asyncio.create_task(h1_request(h, OTHER_TOKEN))
        await eventually(lambda: seats.waiting == 7)
        agent.release.release()  # one of alice's seats frees: bob is next, not alice's 6
        status, _, body = await asyncio.wait_for(bob, 5)
        assert status == 200 and json.loads(body)["user"].endswith(BOB)
        assert agent.order[:3] == [f"cluster:hub:{ALICE}"] * 2 + [f"cluster:hub:{BOB}"]
        # ... while alice's requests are still queued (bob's seat went to the next of them).
        await eventually(lambda: seats.executing == 2)
        assert seats.waiting == 5 and sum(t.done() for t in flood) <= 1
        for _ in range(8):
            agent.release.release()
        results = await asyncio.wait_for(asyncio.gather(*flood), 10)
        assert [r[0] for r in results] == [200] * 8


async def test_rule7_a_flooding_identity_does_not_starve_another_over_h2(fair_tls: Tls) -> None:
    async with gateway(fair_tls, max_executing_requests=2) as (h, agent):
        seats = h.gateway.seats
        assert seats is not None
        alice = await H2Client.connect(h.port, h.tls.ca_file)
        bob = await H2Client.connect(h.port, h.tls.ca_file)
        try:
            flood = [alice.start("/c1/api/v1/pods", token=HUB_TOKEN) for _ in range(8)]
            await eventually(lambda: seats.executing == 2 and seats.waiting == 6)
            sid = bob.start("/c1/api/v1/pods", token=OTHER_TOKEN)
            await eventually(lambda: seats.waiting == 7)
            agent.release.release()
            answer = await bob.wait(sid)
            assert answer.status == 200 and json.loads(answer.body)["user"].endswith(BOB)
            assert agent.order[2] == f"cluster:hub:{BOB}"
            await eventually(lambda: seats.executing == 2)
            assert seats.waiting == 5
            assert sum(1 for s in flood if alice.responses[s].ended) <= 1
            for _ in range(8):
                agent.release.release()
            for s in flood:
                assert (await alice.wait(s, timeout=10)).status == 200
        finally:
            await alice.close()
            await bob.close()


async def test_a_full_queue_is_429_with_retry_after_over_h1(fair_tls: Tls) -> None:
    async with gateway(fair_tls, max_executing_requests=1, fair_queues=1, fair_hand_size=1,
                       fair_queue_length=2) as (h, agent):
        seats = h.gateway.seats
        assert seats is not None
        held = [asyncio.create_task(h1_request(h, HUB_TOKEN)) for _ in range(3)]
        await eventually(lambda: seats.executing == 1 and seats.waiting == 2)
        status, headers, body = await h1_request(h, HUB_TOKEN)
        assert status == 429 and headers["retry-after"] == "1"
        status_obj = json.loads(body)
        assert status_obj["kind"] == "Status" and status_obj["code"] == 429
        assert status_obj["reason"] == "TooManyRequests"
        assert status_obj["details"]["retryAfterSeconds"] == 1
        assert "queue limit 2" in status_obj["message"]
        assert seats.refused["queue_full"] == 1
        assert len(h.streams()) == 1  # the refused request never reached the cluster
        for _ in range(3):
            agent.release.release()
        assert [r[0] for r in await asyncio.gather(*held)] == [200] * 3
        metrics = h.gateway.metrics.render().decode()
        assert 'hubproxy_fair_rejected_total{reason="queue_full"} 1' in metrics
        assert f'hubproxy_fair_flow_rejected_total{{flow="user:{ALICE}"}} 1' in metrics


async def test_a_full_queue_is_429_with_retry_after_over_h2(fair_tls: Tls) -> None:
    async with gateway(fair_tls, max_executing_requests=1, fair_queues=1, fair_hand_size=1,
                       fair_queue_length=2) as (h, agent):
        seats = h.gateway.seats
        assert seats is not None
        client = await H2Client.connect(h.port, h.tls.ca_file)
        try:
            held = [client.start("/c1/api/v1/pods", token=HUB_TOKEN) for _ in range(3)]
            await eventually(lambda: seats.executing == 1 and seats.waiting == 2)
            refused = await client.request("/c1/api/v1/pods", token=HUB_TOKEN)
            assert refused.status == 429 and refused.headers["retry-after"] == "1"
            assert json.loads(refused.body)["reason"] == "TooManyRequests"
            for _ in range(3):
                agent.release.release()
            for sid in held:  # the connection and its other streams carried on
                assert (await client.wait(sid)).status == 200
        finally:
            await client.close()


async def test_a_request_that_waits_too_long_is_429_and_leaves_its_queue(fair_tls: Tls) -> None:
    async with gateway(fair_tls, max_executing_requests=1, fair_queue_wait=0.2) as (h, agent):
        seats = h.gateway.seats
        assert seats is not None
        held = asyncio.create_task(h1_request(h, HUB_TOKEN))
        await eventually(lambda: seats.executing == 1)
        status, headers, body = await h1_request(h, OTHER_TOKEN)
        assert status == 429 and headers["retry-after"] == "1"
        assert "waited too long" in json.loads(body)["message"]
        assert seats.waiting == 0 and seats.refused["timeout"] == 1
        agent.release.release()
        assert (await held)[0] == 200


async def test_a_client_that_leaves_while_queued_frees_its_place(fair_tls: Tls) -> None:
    async with gateway(fair_tls, max_executing_requests=1) as (h, agent):
        seats = h.gateway.seats
        assert seats is not None
        held = asyncio.create_task(h1_request(h, HUB_TOKEN))
        await eventually(lambda: seats.executing == 1)
        _reader, writer = await h.open()
        writer.write(get("/c1/api/v1/pods", OTHER_TOKEN))
        await eventually(lambda: seats.waiting == 1)
        writer.close()
        await eventually(lambda: seats.waiting == 0)
        assert h.gateway.inflight == 1
        agent.release.release()
        assert (await held)[0] == 200
        assert len(h.streams()) == 1  # the one that left never reached the cluster


async def test_watches_take_no_seat(fair_tls: Tls) -> None:
    async def watch_or_hold(stream: FakeStream) -> None:
        head, _ = await stream.request()
        if b"watch=1" in head.target:
            stream.send(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
                        b"Transfer-Encoding: chunked\r\n\r\n2\r\n{}\r\n")
            await stream.wait(lambda: stream.closed, timeout=10)
            return
        await agent.release.acquire()
        stream.send(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\n{}")
        stream.send_eof()

    agent = HeldAgent()
    async with running(fair_tls, max_executing_requests=1) as h:
        h.connect_cluster("c1", watch_or_hold)
        seats = h.gateway.seats
        assert seats is not None
        held = asyncio.create_task(h1_request(h, HUB_TOKEN))
        await eventually(lambda: seats.executing == 1)
        reader, writer = await h.open()
        writer.write(get("/c1/api/v1/pods?watch=1", HUB_TOKEN))
        status, _, _ = await read_head_only(reader)
        assert status == 200 and seats.executing == 1 and seats.waiting == 0
        writer.close()
        agent.release.release()
        assert (await held)[0] == 200


async def read_head_only(reader: asyncio.StreamReader) -> tuple[int, bytes, None]:
    async with asyncio.timeout(5):
        head = await reader.readuntil(b"\r\n\r\n")
    return int(head.split(b" ")[1]), head, None


@pytest.mark.parametrize("seats", [0])
async def test_with_fair_queuing_off_nothing_queues(fair_tls: Tls, seats: int) -> None:
    async with gateway(fair_tls, max_executing_requests=seats) as (h, agent):
        assert h.gateway.seats is None
        flood = [asyncio.create_task(h1_request(h, HUB_TOKEN)) for _ in range(4)]
        await eventually(lambda: len(agent.order) == 4)  # all four reached the cluster at once
        for _ in range(4):
            agent.release.release()
        assert [r[0] for r in await asyncio.gather(*flood)] == [200] * 4
