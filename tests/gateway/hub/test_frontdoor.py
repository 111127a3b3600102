"""The front door on real TLS sockets: keep-alive, pipelining, bodies, 100-continue, refusals."""

from __future__ import annotations

import asyncio
import json
import ssl

import aiohttp
import pytest

from tests.gateway.hub.test_frontdoor_harness import (
    HUB_TOKEN,
    FakeStream,
    Harness,
    get,
    parse_raw,
    read_response,
    running,
    tls,  # noqa: F401  (fixture)
)
from tests.gateway.hub.test_frontdoor_harness import gw as gw

pytestmark = pytest.mark.timeout(30)


async def test_get_is_forwarded_with_identity_and_without_token(gw: Harness) -> None:
    status, _headers, body = parse_raw(
        await gw.exchange(get("/c1/api/v1/pods?limit=5&x=%2Fa", close=True)))
    assert status == 200
    seen = json.loads(body)
    assert seen["method"] == "GET"
    assert seen["target"] == "/api/v1/pods?limit=5&x=%2Fa"  # byte for byte, query included
    assert seen["target_kind"] == "KubeAPITarget"
    names = [n.lower() for n, _ in seen["headers"]]
    assert "authorization" not in names
    assert ("X-Forwarded-Proto", "https") in [tuple(h) for h in seen["headers"]]
    meta = seen["metadata"]
    assert meta["user"] == "cluster:hub:system:serviceaccount:team:alice"
    assert "cluster:hub:system:serviceaccounts" in meta["groups"]
    assert all(not g.endswith("system:authenticated") for g in meta["groups"])
    assert HUB_TOKEN.encode() not in bytes(gw.streams()[0].received)
    assert gw.streams()[0].eof  # request end = half-close


async def test_keep_alive_several_requests_one_connection(gw: Harness) -> None:
    reader, writer = await gw.open()
    for i in range(3):
        writer.write(get(f"/c1/api/v1/namespaces/n{i}"))
        status, _headers, body = await read_response(reader)
        assert status == 200
        assert json.loads(body)["target"] == f"/api/v1/namespaces/n{i}"
    writer.close()
    assert len(gw.streams()) == 3


async def test_pipelined_requests_are_answered_in_order_one_at_a_time(gw: Harness) -> None:
    reader, writer = await gw.open()
    writer.write(b"".join(get(f"/c1/api/v1/p{i}") for i in range(4)))
    targets = []
    for _ in range(4):
        status, _, body = await read_response(reader)
        assert status == 200
        targets.append(json.loads(body)["target"])
    assert targets == [f"/api/v1/p{i}" for i in range(4)]
    # Each stream carried exactly one request (nothing of the next one leaked into it).
    for i, stream in enumerate(gw.streams()):
        assert bytes(stream.received).count(b"HTTP/1.1") == 1, i
    writer.close()


async def test_content_length_body_relayed_verbatim(gw: Harness) -> None:
    body = b'{"kind":"ConfigMap"}'
    raw = (b"POST /c1/api/v1/namespaces/default/configmaps HTTP/1.1\r\nHost: h\r\n"
           b"Authorization: Bearer " + HUB_TOKEN.encode() + b"\r\nContent-Type: application/json"
           b"\r\nContent-Length: %d\r\nConnection: close\r\n\r\n" % len(body) + body)
    status, _, out = parse_raw(await gw.exchange(raw))
    assert status == 200
    assert json.loads(out)["body"] == body.decode()


async def test_chunked_request_body_relayed_verbatim_with_trailer(gw: Harness) -> None:
    chunked = b"5;ext=1\r\nhello\r\n6\r\n world\r\n0\r\nX-Trailer: t\r\n\r\n"
    raw = (b"POST /c1/api/v1/x HTTP/1.1\r\nHost: h\r\nAuthorization: Bearer "
           + HUB_TOKEN.encode() + b"\r\nTransfer-Encoding: chunked\r\n\r\n")
    reader, writer = await gw.open()
    writer.write(raw + chunked[:9])
    await asyncio.sleep(0.05)
    writer.write(chunked[9:] + get("/c1/next"))  # the next request rides behind the body
    status, _, out = await read_response(reader)
    assert status == 200
    assert json.loads(out)["body"] == chunked.decode()
    status, _, out = await read_response(reader)
    assert json.loads(out)["target"] == "/next"
    writer.close()


async def test_chunked_response_relayed_chunk_by_chunk(tls) -> None:  # noqa: F811
    release = asyncio.Event()

    async def watch_agent(stream: FakeStream) -> None:
        await stream.request()
        stream.send(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n")
        stream.send(b"6\r\nevent1\r\n")
        await release.wait()
        stream.send(b"6\r\nevent2\r\n0\r\n\r\n")
        stream.send_eof()

    async with running(tls) as h:
        h.connect_cluster("c1", watch_agent)
        reader, writer = await h.open()
        writer.write(get("/c1/api/v1/pods?watch=1"))
        async with asyncio.timeout(5):
            head = await reader.readuntil(b"\r\n\r\n")
            assert b"200 OK" in head
            assert await reader.readexactly(11) == b"6\r\nevent1\r\n"  # before the end
        release.set()
        async with asyncio.timeout(5):
            assert await reader.readexactly(16) == b"6\r\nevent2\r\n0\r\n\r\n"
        writer.write(get("/c1/again"))  # still keep-alive after a chunked response
        release.set()
        status, _, _ = await read_response(reader)
        assert status == 200
        writer.close()


async def test_expect_100_continue_after_admission(gw: Harness) -> None:
    reader, writer = await gw.open()
    writer.write(b"PUT /c1/api/v1/x HTTP/1.1\r\nHost: h\r\nAuthorization: Bearer "
                 + HUB_TOKEN.encode() + b"\r\nContent-Length: 4\r\nExpect: 100-continue\r\n\r\n")
    async with asyncio.timeout(5):
        interim = await reader.readuntil(b"\r\n\r\n")
    assert interim == b"HTTP/1.1 100 Continue\r\n\r\n"
    writer.write(b"data")
    status, _, body = await read_response(reader)
    assert status == 200
    seen = json.loads(body)
    assert seen["body"] == "data"
    assert "expect" not in [n.lower() for n, _ in seen["headers"]]
    writer.close()


async def test_expect_100_continue_refused_gets_final_status_and_close(gw: Harness) -> None:
    reader, writer = await gw.open()
    writer.write(b"PUT /c1/api/v1/x HTTP/1.1\r\nHost: h\r\nAuthorization: Bearer wrong\r\n"
                 b"Content-Length: 4\r\nExpect: 100-continue\r\n\r\n")
    async with asyncio.timeout(5):
        data = await reader.read(-1)  # closed: the unread body cannot be skipped
    status, headers, body = parse_raw(data)
    assert status == 401
    assert headers["connection"] == "close"
    assert json.loads(body)["reason"] == "Unauthorized"
    writer.close()


async def test_aiohttp_client_keep_alive_and_chunked_upload(gw: Harness) -> None:
    async def gen():
        for part in (b"ab", b"cd", b"ef"):
            yield part

    connector = aiohttp.TCPConnector(ssl=gw.tls.client, limit=1)
    async with aiohttp.ClientSession(connector=connector) as client:
        headers = {"Authorization": f"Bearer {HUB_TOKEN}"}
        for _ in range(2):
            async with client.get(gw.url + "/c1/api", headers=headers) as resp:
                assert resp.status == 200
        async with client.post(gw.url + "/c1/api/v1/upload", headers=headers,
                               data=gen()) as resp:
            assert resp.status == 200
            seen = await resp.json()
            assert seen["body"].endswith("0\r\n\r\n") and "ab" in seen["body"]
    assert len(gw.streams()) == 3


@pytest.mark.parametrize(
    ("raw", "status"),
    [
        (b"GET /c1/a HTTP/1.1\r\nHost: h\r\nContent-Length: 1\r\nContent-Length: 1\r\n\r\n", 400),
        (b"POST /c1/a HTTP/1.1\r\nHost: h\r\nContent-Length: 1\r\n"
         b"Transfer-Encoding: chunked\r\n\r\n", 400),
        (b"GET /c1/a HTTP/1.1\r\nHost: h\r\nX-A: b\r\n c\r\n\r\n", 400),  # obs-fold
        (b"GET /c1/a HTTP/1.1\r\nHost: h\r\nX-A: b\x01c\r\n\r\n", 400),  # control char
        (b"GET /c1/a HTTP/1.1\r\n\r\n", 400),  # no Host
        (b"GET /c1/a HTTP/1.1\r\nHost: h\r\nExpect: magic\r\n\r\n", 417),
        (b"POST /c1/a HTTP/1.1\r\nHost: h\r\nTransfer-Encoding: gzip\r\n\r\n", 501),
        (b"GET /c1/a HTTP/2.0\r\nHost: h\r\n\r\n", 505),
        (b"CONNECT c1:443 HTTP/1.1\r\nHost: h\r\n\r\n", 405),
        (b"GET /c1/" + b"a" * 20000 + b" HTTP/1.1\r\nHost: h\r\n\r\n", 414),
        (b"GET /c1/a HTTP/1.1\r\nHost: h\r\n" + b"X-Big: " + b"b" * 70000 + b"\r\n\r\n", 431),
        (b"GET /c1/a HTTP/1.1\r\nHost: h\r\n" + b"X-A: b\r\n" * 200 + b"\r\n", 431),
    ],
)
async def test_parse_refusals_are_status_json(gw: Harness, raw: bytes, status: int) -> None:
    got, headers, body = parse_raw(await gw.exchange(raw))
    assert got == status
    obj = json.loads(body)
    assert obj["kind"] == "Status" and obj["apiVersion"] == "v1" and obj["code"] == status
    assert obj["status"] == "Failure"
    assert headers["content-type"] == "application/json"
    assert gw.streams() == []  # nothing reached the cluster


async def test_header_timeout_408(tls) -> None:  # noqa: F811
    from gateway.hub.config import FrontDoorLimits

    async with running(tls, limits=FrontDoorLimits(header_timeout=0.3)) as h:
        data = await h.exchange(b"GET /c1/a HTTP/1.1\r\nHost: h\r\n", timeout=5)
        assert parse_raw(data)[0] == 408


async def test_idle_keep_alive_connection_is_closed(tls) -> None:  # noqa: F811
    from gateway.hub.config import FrontDoorLimits

    async with running(tls, limits=FrontDoorLimits(idle_timeout=0.3)) as h:
        reader, writer = await h.open()
        async with asyncio.timeout(5):
            assert await reader.read(-1) == b""
        writer.close()


async def test_pipelined_bytes_are_bounded(tls) -> None:  # noqa: F811
    from gateway.hub.config import FrontDoorLimits

    release = asyncio.Event()

    async def slow_agent(stream: FakeStream) -> None:
        await stream.request()
        await release.wait()
        stream.send(b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n")
        stream.send_eof()

    async with running(tls, limits=FrontDoorLimits(max_buffer=4096)) as h:
        h.connect_cluster("c1", slow_agent)
        reader, writer = await h.open()
        writer.write(get("/c1/a"))
        await asyncio.sleep(0.1)
        (door,) = h.gateway.connections
        writer.write(b"x" * 200_000)  # junk behind a pending request
        await asyncio.sleep(0.3)
        assert "buffer" in door._paused
        assert len(door.buf) < 200_000  # reading stopped: TCP holds the rest
        release.set()
        status, _, _ = await read_response(reader)
        assert status == 200
        writer.close()


@pytest.mark.filterwarnings("ignore::DeprecationWarning")
async def test_tls_below_1_2_refused(gw: Harness) -> None:
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    gw.tls.ca.configure_trust(ctx)
    ctx.maximum_version = ssl.TLSVersion.TLSv1_1
    ctx.minimum_version = ssl.TLSVersion.TLSv1
    with pytest.raises((ssl.SSLError, ConnectionError)):
        await asyncio.open_connection("127.0.0.1", gw.port, ssl=ctx,
                                      server_hostname="localhost")


async def test_curl_get_with_keep_alive(gw: Harness) -> None:
    url = gw.url + "/c1/api/v1/namespaces"
    proc = await asyncio.create_subprocess_exec(
        "curl", "-sS", "--cacert", gw.tls.ca_file, "-H", f"Authorization: Bearer {HUB_TOKEN}",
        "-o", "/dev/null", url, "-o", "/dev/null", url, "-w", "%{http_code} %{num_connects}\n",
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
    out, err = await asyncio.wait_for(proc.communicate(), 20)
    assert proc.returncode == 0, err
    lines = [line for line in out.decode().splitlines() if line.startswith("200 ")]
    assert lines == ["200 1", "200 0"]  # the second request reused the connection


async def test_head_request_gets_status_head_without_body(gw: Harness) -> None:
    data = await gw.exchange(b"HEAD /c1/a HTTP/1.1\r\nHost: h\r\nConnection: close\r\n\r\n")
    status, headers, body = parse_raw(data)
    assert status == 401 and body == b"" and int(headers["content-length"]) > 0


async def test_large_body_arriving_during_admission_is_not_stuck(tls) -> None:  # noqa: F811
    from gateway.hub.config import FrontDoorLimits

    async with running(tls, limits=FrontDoorLimits(max_buffer=1024)) as h:
        h.connect_cluster("c1")
        body = b"z" * 300_000
        reader, writer = await h.open()
        writer.write(b"PUT /c1/api HTTP/1.1\r\nHost: h\r\nAuthorization: Bearer "
                     + HUB_TOKEN.encode() + b"\r\nContent-Length: %d\r\n\r\n" % len(body) + body)
        status, _, out = await read_response(reader, timeout=10)
        assert status == 200 and json.loads(out)["body"] == body.decode()
        writer.close()


async def test_malformed_chunked_body_is_refused(gw: Harness) -> None:
    raw = (b"POST /c1/api HTTP/1.1\r\nHost: h\r\nAuthorization: Bearer " + HUB_TOKEN.encode()
           + b"\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\nhello\r\n0\r\n\r\n")
    status, headers, _ = parse_raw(await gw.exchange(raw))
    assert status == 400 and headers["connection"] == "close"


async def test_stalled_request_body_times_out_and_cancels_upstream(tls) -> None:  # noqa: F811
    from gateway.hub.config import FrontDoorLimits

    async with running(tls, limits=FrontDoorLimits(idle_timeout=0.3)) as h:
        h.connect_cluster("c1")
        reader, writer = await h.open()
        writer.write(b"PUT /c1/api HTTP/1.1\r\nHost: h\r\nAuthorization: Bearer "
                     + HUB_TOKEN.encode() + b"\r\nContent-Length: 100\r\n\r\nabc")
        async with asyncio.timeout(5):
            data = await reader.read(-1)
        assert parse_raw(data)[0] == 408
        assert h.streams()[0].reset_code is not None
        writer.close()


async def test_many_pipelined_refusals_do_not_recurse(gw: Harness) -> None:
    reader, writer = await gw.open()
    n = 3000
    writer.write(b"GET /c1/a HTTP/1.1\r\nHost: h\r\n\r\n" * n)  # all 401 (no token)
    async with asyncio.timeout(20):
        for _ in range(n):
            status, _, _ = await read_response(reader)
            assert status == 401
    writer.close()


async def test_a_response_head_in_pieces_is_relayed_as_the_agent_sent_it(tls) -> None:  # noqa: F811
    """The exchange relays a head that arrives whole from that piece; one that arrives in
    pieces (an interim head, then the final one byte by byte, as memoryviews like the
    tunnel's) is gathered and relayed byte for byte all the same, and the connection lives
    on."""
    interim = b"HTTP/1.1 103 Early Hints\r\nLink: </a>; rel=preload\r\n\r\n"
    final = b"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nContent-Length: 5\r\n\r\nhello"

    async def agent(stream: FakeStream) -> None:
        await stream.request()
        if b"/whole" in bytes(stream.received):
            stream.send(final)
        else:
            pieces = [interim[:7], interim[7:] + final[:3],
                      *(final[i:i + 1] for i in range(3, len(final)))]
            for piece in pieces:
                stream.send(memoryview(bytearray(piece)))  # type: ignore[arg-type]
        stream.send_eof()

    async with running(tls) as h:
        h.connect_cluster("c1", agent)
        reader, writer = await h.open()
        for path, expected in (("/c1/pieces", interim + final), ("/c1/whole", final),
                               ("/c1/pieces", interim + final)):
            writer.write(get(path))
            async with asyncio.timeout(5):
                got = await reader.readexactly(len(expected))
            assert got == expected, path
        writer.close()
