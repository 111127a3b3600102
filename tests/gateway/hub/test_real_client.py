"""The real client behind a load balancer: PROXY protocol and X-Forwarded-For, on real sockets.

A gateway on real TLS, whose front door trusts 127.0.0.1 as a balancer (``proxy_protocol_from``)
or as a TLS-terminating proxy (``forwarded_for_from``); clients write the PROXY header on a raw
TCP connection, then speak TLS on the same socket. What the fake agent receives and what the
audit line says show which client the gateway saw; the failed-authentication limit shows that
one client's bad tokens no longer cost another client's new valid token a 429. Each refusal is
checked on the wire (the connection is closed before TLS) and in the metric.
"""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import json
import logging
import ssl
from typing import Any

import pytest

from gateway.wire.proxyprotocol import v1_header, v2_header
from tests.gateway.hub.h2client import H2Client
from tests.gateway.hub.test_frontdoor_harness import (
    HUB_TOKEN,
    OTHER_TOKEN,
    USERS,
    Harness,
    Tls,
    get,
    h2tls,  # noqa: F401  (fixture)
    parse_raw,
    read_response,
    running,
    tls,  # noqa: F401  (fixture)
)

pytestmark = pytest.mark.timeout(30)

LOOPBACK = (ipaddress.ip_network("127.0.0.1/32"),)
ELSEWHERE = (ipaddress.ip_network("10.0.0.0/8"),)
GATEWAY = ("127.0.0.1", 9092)


async def proxied(h: Harness, header: bytes, *, alpn: list[str] | None = None
                  ) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    """A connection that sends ``header``, then starts TLS on the same socket."""
    reader, writer = await asyncio.open_connection("127.0.0.1", h.port)
    writer.write(header)
    await writer.drain()
    context = h.tls.client
    if alpn:
        context = ssl.create_default_context(cafile=h.tls.ca_file)
        context.set_alpn_protocols(alpn)
    await writer.start_tls(context, server_hostname="localhost")
    return reader, writer


async def ask(h: Harness, header: bytes, path: str = "/c1/api/v1/pods",
              token: str = HUB_TOKEN) -> tuple[int, bytes]:
    reader, writer = await proxied(h, header)
    try:
        writer.write(get(path, token))
        status, _, body = await read_response(reader)
        return status, body
    finally:
        writer.close()
        with contextlib.suppress(Exception):
            await writer.wait_closed()


def forwarded_for(body: bytes) -> list[str]:
    return [v for n, v in json.loads(body)["headers"] if n.lower() == "x-forwarded-for"]


async def closed_before_tls(h: Harness, first_bytes: bytes, *, then_tls: bool = False,
                            timeout: float = 5.0) -> bool:
    """Whether the gateway closes a connection that starts with ``first_bytes`` without a
    byte of answer (and, with ``then_tls``, fails the TLS handshake that follows)."""
    reader, writer = await asyncio.open_connection("127.0.0.1", h.port)
    try:
        writer.write(first_bytes)
        await writer.drain()
        if then_tls:
            with contextlib.suppress(ssl.SSLError, ConnectionError, OSError):
                await writer.start_tls(h.tls.client, server_hostname="localhost")
                return False
            return True
        try:
            async with asyncio.timeout(timeout):
                return await reader.read(-1) == b""
        except ConnectionResetError:  # closed with our bytes unread: the kernel sends RST
            return True
    finally:
        writer.transport.abort()  # (after a failed start_tls, wait_closed would never end)


def complete(response: bytes) -> bool:
    """Whether ``response`` holds a whole head and its Content-Length body."""
    head, sep, body = response.partition(b"\r\n\r\n")
    if not sep:
        return False
    lengths = [line.split(b":", 1)[1] for line in head.split(b"\r\n")
               if line.lower().startswith(b"content-length:")]
    return bool(lengths) and len(body) >= int(lengths[0])


def audit_lines(caplog: pytest.LogCaptureFixture) -> list[dict[str, Any]]:
    return [json.loads(r.getMessage()) for r in caplog.records if r.name == "hubproxy.audit"]


# --- the PROXY protocol ----------------------------------------------------------------------


async def test_proxy_v2_source_is_the_client_everywhere(tls: Tls,  # noqa: F811
                                                        caplog: pytest.LogCaptureFixture
                                                        ) -> None:
    async with running(tls, proxy_protocol_from=LOOPBACK) as h:
        h.connect_cluster("c1")
        h.gateway.audit_trail.lines = True
        caplog.set_level(logging.INFO, logger="hubproxy.audit")
        status, body = await ask(h, v2_header(("203.0.113.7", 40000), GATEWAY))
        assert status == 200
        assert forwarded_for(body) == ["203.0.113.7"]  # what the agent is told
        (line,) = [r for r in audit_lines(caplog) if r["event"] == "request"]
        assert line["client"] == "203.0.113.7" and line["proxies"] == ["127.0.0.1"]


async def test_proxy_v1_and_http2_behind_it(h2tls: Tls) -> None:  # noqa: F811
    async with running(h2tls, proxy_protocol_from=LOOPBACK) as h:
        h.connect_cluster("c1")
        status, body = await ask(h, v1_header(("2001:db8::5", 1234), ("::1", 9092)))
        assert status == 200 and forwarded_for(body) == ["2001:db8::5"]

        # HTTP/2 (ALPN h2 after the header): its streams carry the header's client too.
        reader, writer = await proxied(h, v2_header(("198.51.100.9", 5), GATEWAY),
                                       alpn=["h2", "http/1.1"])
        assert writer.get_extra_info("ssl_object").selected_alpn_protocol() == "h2"
        client = H2Client(reader, writer)
        client.conn.initiate_connection()
        client.flush()
        client._reader_task = asyncio.ensure_future(client._read())
        response = await client.request("/c1/api/v1/pods", token=HUB_TOKEN)
        assert response.status == 200
        assert forwarded_for(bytes(response.body)) == ["198.51.100.9"]
        await client.close()


async def test_header_and_client_hello_in_one_segment(tls: Tls) -> None:  # noqa: F811
    """The balancer's header and the client's first TLS bytes arrive together: the gateway
    takes exactly the header and leaves the ClientHello to TLS."""
    async with running(tls, proxy_protocol_from=LOOPBACK) as h:
        h.connect_cluster("c1")
        reader, writer = await asyncio.open_connection("127.0.0.1", h.port)
        incoming, outgoing = ssl.MemoryBIO(), ssl.MemoryBIO()
        tls_client = h.tls.client.wrap_bio(incoming, outgoing, server_hostname="localhost")
        with contextlib.suppress(ssl.SSLWantReadError):
            tls_client.do_handshake()
        hello = outgoing.read()
        assert hello[:1] == b"\x16"
        writer.write(v2_header(("192.0.2.44", 7), GATEWAY) + hello)  # one write
        while True:
            try:
                tls_client.do_handshake()
                break
            except ssl.SSLWantReadError:
                writer.write(outgoing.read())
                data = await asyncio.wait_for(reader.read(65536), 5)
                assert data, "the gateway closed the connection during the handshake"
                incoming.write(data)
        writer.write(outgoing.read())
        tls_client.write(get("/c1/api/v1/pods", close=True))
        writer.write(outgoing.read())
        plain = b""
        while not complete(plain):
            data = await asyncio.wait_for(reader.read(65536), 5)
            assert data, "closed before the whole response"
            incoming.write(data)
            with contextlib.suppress(ssl.SSLWantReadError):
                while chunk := tls_client.read(65536):
                    plain += chunk
        writer.close()
        status, _, body = parse_raw(plain)
        assert status == 200 and forwarded_for(body) == ["192.0.2.44"]


async def test_local_and_unknown_keep_the_balancers_address(tls: Tls) -> None:  # noqa: F811
    async with running(tls, proxy_protocol_from=LOOPBACK) as h:
        h.connect_cluster("c1")
        status, body = await ask(h, v2_header(None, command=0))  # LOCAL: a health check
        assert status == 200 and forwarded_for(body) == ["127.0.0.1"]
        status, body = await ask(h, b"PROXY UNKNOWN\r\n")
        assert status == 200 and forwarded_for(body) == ["127.0.0.1"]


async def test_failed_authentications_count_per_real_client(tls: Tls) -> None:  # noqa: F811
    """Client A's bad tokens fill A's bucket only: client B's new valid token passes. Without
    trust, both are the balancer's address and B gets 429 (the control)."""
    async def run(trust: bool) -> tuple[list[int], int]:
        overrides: dict[str, Any] = {"auth_failure_burst": 3, "auth_failure_rate": 0.01}
        if trust:
            overrides["proxy_protocol_from"] = LOOPBACK
        async with running(tls, **overrides) as h:
            h.connect_cluster("c1")
            a = v2_header(("198.51.100.1", 1111), GATEWAY) if trust else b""
            b = v2_header(("198.51.100.2", 2222), GATEWAY) if trust else b""
            bad = [(await ask(h, a, token=f"bad-token-{i:04d}-xxxxxxxxxx"))[0]
                   for i in range(6)]
            good = (await ask(h, b, token=OTHER_TOKEN))[0]  # never reviewed: not cached
            return bad, good

    bad, good = await run(trust=True)
    assert bad == [401, 401, 401, 429, 429, 429] and good == 200
    bad, good = await run(trust=False)
    assert bad == [401, 401, 401, 429, 429, 429] and good == 429
    assert OTHER_TOKEN in USERS  # it is a valid token: the 429 is the shared bucket's


# --- refusals, before TLS --------------------------------------------------------------------


async def test_trusted_address_without_a_header_is_refused(tls: Tls) -> None:  # noqa: F811
    async with running(tls, proxy_protocol_from=LOOPBACK) as h:
        h.connect_cluster("c1")
        with pytest.raises((ssl.SSLError, ConnectionError, OSError)):
            await asyncio.open_connection("127.0.0.1", h.port, ssl=h.tls.client,
                                          server_hostname="localhost")
        assert await closed_before_tls(h, b"GET / HTTP/1.1\r\n\r\n")
        refused = h.gateway.metrics.proxy_protocol_refused
        assert refused["missing"] == 2
        assert b'hubproxy_proxy_protocol_refused_total{reason="missing"} 2' in \
            h.gateway.metrics.render()


async def test_header_from_an_untrusted_address_is_refused(tls: Tls) -> None:  # noqa: F811
    async with running(tls, proxy_protocol_from=ELSEWHERE) as h:
        h.connect_cluster("c1")
        assert await closed_before_tls(h, v2_header(("192.0.2.1", 1), GATEWAY), then_tls=True)
        assert await closed_before_tls(h, v1_header(("192.0.2.1", 1), GATEWAY))
        assert h.gateway.metrics.proxy_protocol_refused["untrusted"] == 2
        # The same address speaking TLS straight away is served, as itself.
        reader, writer = await h.open()
        writer.write(get("/c1/api/v1/pods", close=True))
        status, _, body = await read_response(reader)
        writer.close()
        assert status == 200 and forwarded_for(body) == ["127.0.0.1"]


@pytest.mark.parametrize(("first_bytes", "reason"), [
    (b"PROXY TCP4 192.0.2.1 10.0.0.1 1 443\n", "malformed"),  # bare LF
    (b"PROXY TCP4 192.0.2.01 10.0.0.1 1 443\r\n", "malformed"),
    (b"PROXY UNKNOWN " + b"x" * 100, "oversized"),
    (v2_header(("192.0.2.1", 1), GATEWAY)[:12] + b"\x22\x11\x00\x0c" + bytes(12), "malformed"),
    (v2_header(None)[:14] + b"\xff\xff", "oversized"),  # refused from the length alone
])
async def test_broken_headers_are_refused(tls: Tls, first_bytes: bytes, reason: str) -> None:  # noqa: F811
    async with running(tls, proxy_protocol_from=LOOPBACK) as h:
        assert await closed_before_tls(h, first_bytes)
        assert h.gateway.metrics.proxy_protocol_refused == {reason: 1}


async def test_slow_or_truncated_header_times_out(tls: Tls) -> None:  # noqa: F811
    from gateway.hub.config import FrontDoorLimits

    async with running(tls, proxy_protocol_from=LOOPBACK,
                       limits=FrontDoorLimits(header_timeout=0.5)) as h:
        full = v2_header(("192.0.2.1", 1), GATEWAY)
        started = asyncio.get_running_loop().time()
        assert await closed_before_tls(h, full[:20])  # truncated: 8 bytes never come
        assert asyncio.get_running_loop().time() - started < 3
        # Slow: one byte at a time, slower than the timeout allows in total.
        reader, writer = await asyncio.open_connection("127.0.0.1", h.port)
        with contextlib.suppress(ConnectionError):
            for byte in full[:10]:
                writer.write(bytes([byte]))
                await writer.drain()
                await asyncio.sleep(0.1)
        with contextlib.suppress(ConnectionError):  # reset or broken pipe: closed too
            assert await asyncio.wait_for(reader.read(-1), 5) == b""
        writer.close()
        assert h.gateway.metrics.proxy_protocol_refused["timeout"] == 2


async def test_closed_before_the_header(tls: Tls) -> None:  # noqa: F811
    async with running(tls, proxy_protocol_from=LOOPBACK) as h:
        _, writer = await asyncio.open_connection("127.0.0.1", h.port)
        writer.close()
        for _ in range(100):
            if h.gateway.metrics.proxy_protocol_refused["closed"]:
                break
            await asyncio.sleep(0.02)
        assert h.gateway.metrics.proxy_protocol_refused == {"closed": 1}


# --- X-Forwarded-For from trusted proxies ----------------------------------------------------


async def xff(h: Harness, *values: str) -> tuple[int, list[str]]:
    extra = "".join(f"X-Forwarded-For: {v}\r\n" for v in values)
    status, _, body = parse_raw(await h.exchange(get("/c1/api/v1/pods", extra=extra,
                                                     close=True)))
    return status, forwarded_for(body) if status == 200 else []


async def test_forwarded_for_right_most_untrusted_entry(tls: Tls) -> None:  # noqa: F811
    trusted = (ipaddress.ip_network("127.0.0.1/32"), ipaddress.ip_network("10.0.0.0/8"))
    async with running(tls, forwarded_for_from=trusted) as h:
        h.connect_cluster("c1")
        assert await xff(h, "203.0.113.5") == (200, ["203.0.113.5"])
        # What the client wrote on the left is ignored; the proxies' own hops are skipped.
        assert await xff(h, "1.1.1.1, 203.0.113.5, 10.1.2.3") == (200, ["203.0.113.5"])
        assert await xff(h, "1.1.1.1", "203.0.113.5:4711", "10.9.9.9") == (200, ["203.0.113.5"])
        assert await xff(h, "[2001:db8::9]:443") == (200, ["2001:db8::9"])
        # Garbage where a proxy would have written an address: the last trusted hop.
        assert await xff(h, "203.0.113.5, not-an-ip, 10.1.2.3") == (200, ["10.1.2.3"])
        assert await xff(h) == (200, ["127.0.0.1"])  # no header: the peer


async def test_forwarded_for_ignored_from_untrusted_peers_and_by_default(tls: Tls) -> None:  # noqa: F811
    async with running(tls, forwarded_for_from=ELSEWHERE) as h:
        h.connect_cluster("c1")
        assert await xff(h, "203.0.113.5") == (200, ["127.0.0.1"])
    async with running(tls) as h:
        h.connect_cluster("c1")
        assert await xff(h, "203.0.113.5") == (200, ["127.0.0.1"])


async def test_a_spoofed_forwarded_for_does_not_reset_the_limit(tls: Tls) -> None:  # noqa: F811
    """Behind a trusted proxy, a client that rotates the left part of X-Forwarded-For stays
    one client: the proxy's entry (here the right-most) is what counts."""
    async with running(tls, forwarded_for_from=LOOPBACK, auth_failure_burst=2,
                       auth_failure_rate=0.01) as h:
        h.connect_cluster("c1")
        codes = []
        for i in range(4):
            raw = get("/c1/api/v1/pods", f"bad-token-{i:04d}-xxxxxxxxxx",
                      extra=f"X-Forwarded-For: 192.0.2.{i + 1}, 203.0.113.66\r\n", close=True)
            codes.append(parse_raw(await h.exchange(raw))[0])
        assert codes == [401, 401, 429, 429]
        other = get("/c1/api/v1/pods", OTHER_TOKEN,
                    extra="X-Forwarded-For: 203.0.113.77\r\n", close=True)
        assert parse_raw(await h.exchange(other))[0] == 200

