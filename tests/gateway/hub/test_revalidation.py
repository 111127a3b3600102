"""Revocation reaches open streams (issue 14 item 5), on real TLS sockets with fake agents.

A long-running request is asked about again as its cached review expires; once the hub cleanly
says no it is closed properly (a watch with its terminating chunk at a chunk boundary, a
WebSocket exec with an error-channel Status and a close frame at a frame boundary, SPDY at the
connection when it has no error stream), and the upstream stream is reset. A hub that cannot
answer closes nothing. The process-level proofs (kubectl, the real hub) are in
tests/realkube/test_revocation.py and tests/e2e/test_revocation.py.
"""

from __future__ import annotations

import asyncio
import json
import struct
from collections.abc import Iterator

import pytest

from gateway.hub.admission.auth import UserInfo
from gateway.hub.admission.authorize import NotAuthorized
from tests.gateway.hub.test_forward import ws_request
from tests.gateway.hub.test_frontdoor_harness import (
    USERS,
    FakeStream,
    get,
    read_response,
    running,
    tls,  # noqa: F401
)

pytestmark = pytest.mark.timeout(30)

TOKEN = "hub-token-CAROL-revocable-0001"
TTL = 0.5  # the revalidator looks every max(0.5 s, TTL)
WATCH = "/c1/api/v1/namespaces/team/configmaps?watch=1"
EXEC = "/c1/api/v1/namespaces/team/pods/web/exec?command=sh&stdin=true&stdout=true"
EVENT = b'{"type":"ADDED","object":{"kind":"ConfigMap"}}\n'


@pytest.fixture
def carol() -> Iterator[str]:
    USERS[TOKEN] = {"username": "carol", "uid": "uid-c", "groups": ["devs"], "extra": {}}
    yield TOKEN
    USERS.pop(TOKEN, None)


def chunk(data: bytes) -> bytes:
    return b"%x\r\n%s\r\n" % (len(data), data)


def streaming_agent(first: bytes) -> tuple[list[FakeStream], object]:
    """An agent that starts a chunked watch response with ``first`` and then waits."""
    streams: list[FakeStream] = []

    async def agent(stream: FakeStream) -> None:
        await stream.request()
        streams.append(stream)
        stream.send(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
                    b"Transfer-Encoding: chunked\r\n\r\n" + first)
        await stream.wait(lambda: stream.closed, timeout=25)

    return streams, agent


async def wait_for(predicate: object, timeout: float = 5.0) -> None:
    async with asyncio.timeout(timeout):
        while not predicate():  # type: ignore[operator]
            await asyncio.sleep(0.02)


async def read_chunks(reader: asyncio.StreamReader, timeout: float) -> list[bytes]:
    """Chunks of a chunked body up to and including the terminating (empty) one."""
    chunks = []
    async with asyncio.timeout(timeout):
        while True:
            size = int((await reader.readuntil(b"\r\n")).split(b";")[0], 16)
            data = await reader.readexactly(size + 2)
            chunks.append(data[:-2])
            if size == 0:
                return chunks


async def test_rule1_revoked_token_ends_a_watch_with_its_last_chunk(tls, carol) -> None:  # noqa: F811
    async with running(tls, token_cache_ttl=TTL) as h:
        streams, agent = streaming_agent(chunk(EVENT))
        h.connect_cluster("c1", agent)
        reader, writer = await h.open()
        writer.write(get(WATCH, carol))
        async with asyncio.timeout(5):
            assert (await reader.readuntil(b"\r\n\r\n")).startswith(b"HTTP/1.1 200")
        await asyncio.sleep(3 * TTL)  # revalidated while the token stays valid: still open
        assert not streams[0].closed
        started = asyncio.get_running_loop().time()
        del USERS[carol]  # the hub revokes the token
        assert await read_chunks(reader, timeout=5) == [EVENT, b""]
        took = asyncio.get_running_loop().time() - started
        assert took < TTL + 0.5 + 3.0, took  # TTL + period + slack for a busy machine
        await wait_for(lambda: streams[0].closed)  # the managed cluster's watch is cancelled
        # The connection stays usable, and the client's re-list gets the 401.
        writer.write(get("/c1/api/v1/namespaces/team/configmaps", carol, close=True))
        status, _, body = await read_response(reader)
        assert status == 401 and json.loads(body)["reason"] == "Unauthorized"
        writer.close()


async def test_a_watch_mid_chunk_ends_after_that_chunk(tls, carol) -> None:  # noqa: F811
    async with running(tls, token_cache_ttl=TTL) as h:
        partial = b"%x\r\n%s" % (len(EVENT), EVENT[:10])
        streams, agent = streaming_agent(partial)
        h.connect_cluster("c1", agent)
        reader, writer = await h.open()
        writer.write(get(WATCH, carol))
        async with asyncio.timeout(5):
            await reader.readuntil(b"\r\n\r\n")
        del USERS[carol]
        await asyncio.sleep(2 * TTL + 0.5)  # revoked, but in the middle of a chunk
        assert not streams[0].closed
        # The rest of that event and one more: only the first completes, then the last chunk.
        streams[0].send(EVENT[10:] + b"\r\n" + chunk(b"NOT-RELAYED"))
        assert await read_chunks(reader, timeout=5) == [EVENT, b""]
        await wait_for(lambda: streams[0].closed)
        writer.close()


async def test_a_watch_stalled_mid_chunk_is_closed_after_the_grace(tls, carol) -> None:  # noqa: F811
    async with running(tls, token_cache_ttl=TTL) as h:
        streams, agent = streaming_agent(b"40\r\nabc")
        h.connect_cluster("c1", agent)
        reader, writer = await h.open()
        writer.write(get(WATCH, carol))
        async with asyncio.timeout(5):
            await reader.readuntil(b"\r\n\r\n")
        del USERS[carol]
        async with asyncio.timeout(TTL + 0.5 + 5.0 + 2.0):  # + ENDING_GRACE
            rest = await reader.read(-1)  # the connection closes
        assert rest == b"40\r\nabc"
        await wait_for(lambda: streams[0].closed)
        writer.close()


# grace 0: the recheck itself meets the hub's errors; the default grace answers them with the
# hub's last yes (--hub-outage-grace), which must not close the stream either.
@pytest.mark.parametrize("grace", [0.0, 300.0])
async def test_hub_errors_never_close_a_stream(tls, carol, grace: float) -> None:  # noqa: F811
    async with running(tls, token_cache_ttl=TTL, hub_outage_grace=grace) as h:
        streams, agent = streaming_agent(chunk(EVENT))
        h.connect_cluster("c1", agent)
        reader, writer = await h.open()
        writer.write(get(WATCH, carol))
        async with asyncio.timeout(5):
            await reader.readuntil(b"\r\n\r\n")
        seen = len(h.reviewer.seen)
        h.reviewer.down = True  # TokenReview now fails: neither yes nor no
        await asyncio.sleep(4 * TTL + 0.5)
        assert len(h.reviewer.seen) > seen  # it did ask
        assert not streams[0].closed
        streams[0].send(chunk(b"still-flowing"))
        assert await read_chunks_n(reader, 2) == [EVENT, b"still-flowing"]
        # And once the hub answers again with a clean no, the stream ends.
        del USERS[carol]
        h.reviewer.down = False
        assert await read_chunks(reader, timeout=5) == [b""]
        writer.close()


async def read_chunks_n(reader: asyncio.StreamReader, n: int) -> list[bytes]:
    out = []
    async with asyncio.timeout(5):
        for _ in range(n):
            size = int((await reader.readuntil(b"\r\n")).split(b";")[0], 16)
            out.append((await reader.readexactly(size + 2))[:-2])
    return out


async def test_revalidation_can_be_turned_off(tls, carol) -> None:  # noqa: F811
    async with running(tls, token_cache_ttl=TTL, revalidate_streams=False) as h:
        streams, agent = streaming_agent(chunk(EVENT))
        h.connect_cluster("c1", agent)
        reader, writer = await h.open()
        writer.write(get(WATCH, carol))
        async with asyncio.timeout(5):
            await reader.readuntil(b"\r\n\r\n")
        del USERS[carol]
        await asyncio.sleep(4 * TTL + 0.5)
        assert not streams[0].closed
        writer.close()
        await wait_for(lambda: streams[0].closed)


class RevocableAuthorizer:
    """Allows everyone except the users in ``denied`` (the hub SAR, cleanly)."""

    def __init__(self) -> None:
        self.denied: set[str] = set()

    def allowed_cached(self, user: UserInfo, cluster: str) -> bool:
        return False

    async def authorize(self, user: UserInfo, cluster: str) -> None:
        if user.username in self.denied:
            raise NotAuthorized(f'user may not use cluster "{cluster}"')


def websocket_agent(protocol: bytes, frames: bytes) -> tuple[list[FakeStream], object]:
    streams: list[FakeStream] = []

    async def agent(stream: FakeStream) -> None:
        await stream.request()
        streams.append(stream)
        stream.send(b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\n"
                    b"Connection: Upgrade\r\nSec-WebSocket-Protocol: " + protocol + b"\r\n\r\n"
                    + frames)
        await stream.wait(lambda: stream.closed, timeout=25)

    return streams, agent


def ws_frame(payload: bytes, opcode: int = 2) -> bytes:
    return struct.pack("!BB", 0x80 | opcode, len(payload)) + payload


async def read_ws_frame(reader: asyncio.StreamReader) -> tuple[int, bytes]:
    b0, b1 = await reader.readexactly(2)
    length = b1 & 0x7F
    if length == 126:
        length = struct.unpack("!H", await reader.readexactly(2))[0]
    return b0 & 0x0F, await reader.readexactly(length)


async def test_rule1_lost_cluster_access_ends_an_exec_with_a_status_and_a_close_frame(
        tls) -> None:  # noqa: F811
    authorizer = RevocableAuthorizer()
    async with running(tls, token_cache_ttl=TTL, authorizer=authorizer) as h:
        stdout = ws_frame(b"\x01hello")
        # The server is in the middle of a frame when the hub says no: header + 2 bytes of 7.
        streams, agent = websocket_agent(b"v5.channel.k8s.io", stdout + stdout[:4])
        h.connect_cluster("c1", agent)
        reader, writer = await h.open()
        writer.write(ws_request(EXEC, "hub-token-ALICE-0123456789"))
        async with asyncio.timeout(5):
            assert (await reader.readuntil(b"\r\n\r\n")).startswith(b"HTTP/1.1 101")
            assert await read_ws_frame(reader) == (2, b"\x01hello")
        authorizer.denied.add("system:serviceaccount:team:alice")
        await asyncio.sleep(2 * TTL + 0.5)
        assert not streams[0].closed  # waits for the end of the frame in progress
        streams[0].send(stdout[4:] + ws_frame(b"\x01NOT-RELAYED"))
        async with asyncio.timeout(5):
            assert await read_ws_frame(reader) == (2, b"\x01hello")
            opcode, payload = await read_ws_frame(reader)
            assert opcode == 2 and payload[0] == 3  # the error channel
            status = json.loads(payload[1:])
            assert (status["status"], status["code"], status["reason"]) == (
                "Failure", 403, "Forbidden")
            assert "revoked" in status["message"]
            opcode, payload = await read_ws_frame(reader)  # a normal close ends the channel
            assert opcode == 8 and struct.unpack("!H", payload[:2])[0] == 1000
            assert await reader.read(-1) == b""  # then the connection closes
        await wait_for(lambda: streams[0].closed)
        writer.close()


async def test_spdy_without_a_known_error_stream_is_closed_at_the_connection(
        tls, carol) -> None:  # noqa: F811
    async with running(tls, token_cache_ttl=TTL) as h:
        streams: list[FakeStream] = []

        async def agent(stream: FakeStream) -> None:
            await stream.request()
            streams.append(stream)
            stream.send(b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: SPDY/3.1\r\n"
                        b"Connection: Upgrade\r\nX-Stream-Protocol-Version: v4.channel.k8s.io"
                        b"\r\n\r\nspdy-bytes")
            await stream.wait(lambda: stream.closed, timeout=25)

        h.connect_cluster("c1", agent)
        reader, writer = await h.open()
        writer.write((f"POST {EXEC} HTTP/1.1\r\nHost: h\r\nAuthorization: Bearer {carol}\r\n"
                      "Upgrade: SPDY/3.1\r\nConnection: Upgrade\r\n"
                      "X-Stream-Protocol-Version: v4.channel.k8s.io\r\n\r\n").encode())
        async with asyncio.timeout(5):
            assert (await reader.readuntil(b"\r\n\r\n")).startswith(b"HTTP/1.1 101")
        del USERS[carol]
        async with asyncio.timeout(TTL + 0.5 + 4.0):
            assert await reader.read(-1) == b"spdy-bytes"
        await wait_for(lambda: streams[0].closed)
        writer.close()


async def test_a_short_request_is_not_revalidated(tls, carol) -> None:  # noqa: F811
    """Only long-running requests carry what to ask again (nothing else is kept)."""
    async with running(tls, token_cache_ttl=TTL) as h:
        seen: list[object] = []

        async def agent(stream: FakeStream) -> None:
            await stream.request()
            seen.append(stream.protocol.admitted.recheck)
            stream.send(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\n{}")
            stream.send_eof()

        h.connect_cluster("c1", agent)
        reader, writer = await h.open()
        writer.write(get("/c1/api/v1/namespaces/team/configmaps", carol, close=True))
        assert (await read_response(reader))[0] == 200
        assert seen == [None]
        writer.close()


async def test_a_port_forward_websocket_gets_a_close_frame_that_says_why(tls, carol) -> None:  # noqa: F811
    async with running(tls, token_cache_ttl=TTL) as h:
        streams, agent = websocket_agent(b"SPDY/3.1+portforward.k8s.io", b"")
        h.connect_cluster("c1", agent)
        reader, writer = await h.open()
        writer.write(ws_request("/c1/api/v1/namespaces/team/pods/web/portforward?ports=80",
                                carol, protocols="SPDY/3.1+portforward.k8s.io"))
        async with asyncio.timeout(5):
            assert (await reader.readuntil(b"\r\n\r\n")).startswith(b"HTTP/1.1 101")
        del USERS[carol]
        async with asyncio.timeout(TTL + 0.5 + 4.0):
            opcode, payload = await read_ws_frame(reader)
            assert opcode == 8 and struct.unpack("!H", payload[:2])[0] == 1008
            assert payload[2:] == b"the bearer token is no longer valid on the hub"
            assert await reader.read(-1) == b""
        await wait_for(lambda: streams[0].closed)
        writer.close()


async def test_rule1_a_group_change_ends_a_watch_as_revocation_does(tls, carol) -> None:  # noqa: F811
    """Issue 24: the recheck asked the hub with the user's current groups but the stream went
    on impersonating the old ones. A review that now returns other groups ends it as a
    revocation does; the client's re-watch carries the new groups. The same groups in another
    order change nothing."""
    async with running(tls, token_cache_ttl=TTL) as h:
        streams, agent = streaming_agent(chunk(EVENT))
        h.connect_cluster("c1", agent)
        reader, writer = await h.open()
        writer.write(get(WATCH, carol))
        async with asyncio.timeout(5):
            assert (await reader.readuntil(b"\r\n\r\n")).startswith(b"HTTP/1.1 200")
        assert json.loads(streams[0].metadata)["groups"] == ["cluster:hub:devs"]
        started = asyncio.get_running_loop().time()
        USERS[carol] = {**USERS[carol], "groups": ["devs", "readers"]}  # the hub adds one
        assert await read_chunks(reader, timeout=TTL + 0.5 + 3.0) == [EVENT, b""]
        assert asyncio.get_running_loop().time() - started < TTL + 0.5 + 3.0
        await wait_for(lambda: streams[0].closed)  # the managed cluster's watch is cancelled
        writer.write(get(WATCH, carol))  # the client watches again
        async with asyncio.timeout(5):
            assert (await reader.readuntil(b"\r\n\r\n")).startswith(b"HTTP/1.1 200")
        await wait_for(lambda: len(streams) == 2)
        assert json.loads(streams[1].metadata)["groups"] == ["cluster:hub:devs",
                                                             "cluster:hub:readers"]
        USERS[carol] = {**USERS[carol], "groups": ["readers", "devs"]}
        await asyncio.sleep(3 * TTL + 0.5)  # rechecked: the same groups, reordered
        assert not streams[1].closed
        USERS[carol] = {**USERS[carol], "groups": ["ops"]}  # the hub moves carol once more
        assert await read_chunks(reader, timeout=TTL + 0.5 + 3.0) == [EVENT, b""]
        await wait_for(lambda: streams[1].closed)
        assert h.gateway.revalidator is not None and h.gateway.revalidator.revoked == 2
        writer.close()


async def test_a_group_change_ends_an_exec_with_a_status_that_says_why(tls, carol) -> None:  # noqa: F811
    async with running(tls, token_cache_ttl=TTL) as h:
        streams, agent = websocket_agent(b"v5.channel.k8s.io", ws_frame(b"\x01hello"))
        h.connect_cluster("c1", agent)
        reader, writer = await h.open()
        writer.write(ws_request(EXEC, carol))
        async with asyncio.timeout(5):
            assert (await reader.readuntil(b"\r\n\r\n")).startswith(b"HTTP/1.1 101")
            assert await read_ws_frame(reader) == (2, b"\x01hello")
        USERS[carol] = {**USERS[carol], "groups": []}  # carol left every group
        async with asyncio.timeout(TTL + 0.5 + 5.0):
            opcode, payload = await read_ws_frame(reader)
            assert opcode == 2 and payload[0] == 3  # the error channel
            status = json.loads(payload[1:])
            assert (status["code"], status["reason"]) == (401, "Unauthorized")
            assert "groups changed" in status["message"]
            opcode, payload = await read_ws_frame(reader)
            assert opcode == 8
        await wait_for(lambda: streams[0].closed)
        writer.close()
