"""Issue 14, security hardening: each test attacks the gateway through its real TLS front door
(the in-process harness) or a real gateway process, and asserts on what a managed cluster would
have received (nothing, for a refusal) and on the exact answer."""

from __future__ import annotations

import asyncio
import base64
import json
import time

import aiohttp
import pytest

from tests.gateway.hub.test_frontdoor_harness import (
    HUB_TOKEN,
    OTHER_TOKEN,
    USERS,
    Harness,
    get,
    parse_raw,
    tls,  # noqa: F401
)
from tests.gateway.hub.test_frontdoor_harness import gw as gw

pytestmark = pytest.mark.timeout(60)


def status_of(data: bytes) -> tuple[int, dict]:
    status, _, body = parse_raw(data)
    obj = json.loads(body)
    assert obj["kind"] == "Status" and obj["code"] == status
    return status, obj


# --- encoded path separators (issue 14 item 2) --------------------------------------------------


@pytest.mark.parametrize(
    "path",
    [
        "/c1/api/v1/namespaces/demo%2Fconfigmaps",
        "/c1/api/v1/namespaces/demo%2fconfigmaps",
        "/c1/api/v1/namespaces/demo%5Cconfigmaps",
        "/c1/api/v1/namespaces/demo/configmaps/x%2E",
        "/c1/api/v1/namespaces/%2E%2E/secrets",
        "/c1/api/v1//secrets",
        "/c1//api/v1/secrets",
    ],
)
async def test_rule6_encoded_separators_and_empty_segments_refused(gw: Harness, path: str
                                                                   ) -> None:
    status, obj = status_of(await gw.exchange(get(path, close=True)))
    assert status == 400 and obj["reason"] == "BadRequest"
    assert gw.streams() == []  # nothing reached the managed cluster


async def test_service_form_remainder_forwarded_untouched(gw: Harness) -> None:
    path = "/c1/api/v1/namespaces/ns/services/web:80/proxy-service/files/a%2Fb//c%2E?q=%2F"
    status, _, body = parse_raw(await gw.exchange(get(path, close=True)))
    assert status == 200
    assert json.loads(body)["target"] == "/files/a%2Fb//c%2E?q=%2F"


async def test_query_may_encode_slashes(gw: Harness) -> None:
    path = "/c1/api/v1/pods?labelSelector=app%3Dweb%2Cteam%2Fx"
    status, _, body = parse_raw(await gw.exchange(get(path, close=True)))
    assert status == 200
    assert json.loads(body)["target"] == "/api/v1/pods?labelSelector=app%3Dweb%2Cteam%2Fx"


# --- ambiguous credentials and upgrades (issue 14 item 3) ---------------------------------------

EXEC = "/c1/api/v1/namespaces/default/pods/web/exec?command=sh&stdin=true"
PORTFORWARD = "/c1/api/v1/namespaces/default/pods/web/portforward"
WS = ("Upgrade: websocket\r\nConnection: Upgrade\r\nSec-WebSocket-Version: 13\r\n"
      "Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n")
SPDY = "Upgrade: SPDY/3.1\r\nConnection: Upgrade\r\n"


def token_protocol(token: str) -> str:
    enc = base64.urlsafe_b64encode(token.encode()).rstrip(b"=").decode()
    return f"base64url.bearer.authorization.k8s.io.{enc}"


async def refused_400(gw: Harness, raw: bytes) -> dict:
    status, obj = status_of(await gw.exchange(raw))
    assert status == 400, obj
    assert gw.streams() == [], "a refused request reached the managed cluster"
    assert HUB_TOKEN not in obj["message"] and OTHER_TOKEN not in obj["message"]
    return obj


async def test_rule1_two_authorization_headers_are_400(gw: Harness) -> None:
    raw = get("/c1/api", extra=f"Authorization: Bearer {OTHER_TOKEN}\r\n", close=True)
    assert "more than one Authorization" in (await refused_400(gw, raw))["message"]


async def test_rule1_authorization_and_a_different_subprotocol_token_are_400(gw: Harness) -> None:
    extra = WS + f"Sec-WebSocket-Protocol: {token_protocol(OTHER_TOKEN)}, v5.channel.k8s.io\r\n"
    obj = await refused_400(gw, get(EXEC, token=HUB_TOKEN, extra=extra))
    assert "different tokens" in obj["message"]


async def test_authorization_and_the_same_subprotocol_token_pass(gw: Harness) -> None:
    extra = WS + f"Sec-WebSocket-Protocol: {token_protocol(HUB_TOKEN)}, v5.channel.k8s.io\r\n"
    status, _, body = parse_raw(await gw.exchange(get(EXEC, token=HUB_TOKEN, extra=extra)))
    assert status == 200  # the echo agent answers the upgrade with a plain 200
    forwarded = json.loads(body)
    assert forwarded["metadata"]["user"] == "cluster:hub:system:serviceaccount:team:alice"
    assert ["Sec-WebSocket-Protocol", "v5.channel.k8s.io"] in forwarded["headers"]


@pytest.mark.parametrize(
    "upgrade",
    [
        "Upgrade: websocket\r\nUpgrade: h2c\r\nConnection: Upgrade\r\n"
        "Sec-WebSocket-Protocol: v5.channel.k8s.io\r\n",
        "Upgrade: h2c\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
        "Sec-WebSocket-Protocol: v5.channel.k8s.io\r\n",
        "Upgrade: SPDY/3.1\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
        "X-Stream-Protocol-Version: v4.channel.k8s.io\r\n",
    ],
)
async def test_two_upgrade_headers_are_400(gw: Harness, upgrade: str) -> None:
    assert "more than one Upgrade" in (await refused_400(gw, get(EXEC, extra=upgrade)))["message"]


@pytest.mark.parametrize(
    ("path", "upgrade"),
    [
        (EXEC, WS),
        (EXEC, WS + "Sec-WebSocket-Protocol: chat\r\n"),
        (EXEC, WS + f"Sec-WebSocket-Protocol: {token_protocol(HUB_TOKEN)}\r\n"),
        (EXEC, SPDY),
        (EXEC, SPDY + "X-Stream-Protocol-Version: h2\r\n"),
        (PORTFORWARD, SPDY + "Sec-WebSocket-Protocol: SPDY/3.1+portforward.k8s.io\r\n"),
    ],
)
async def test_upgrade_without_a_kubernetes_stream_protocol_is_400(gw: Harness, path: str,
                                                                   upgrade: str) -> None:
    obj = await refused_400(gw, get(path, extra=upgrade))
    assert "no Kubernetes stream protocol" in obj["message"]


@pytest.mark.parametrize(
    ("path", "upgrade"),
    [
        (EXEC, WS + "Sec-WebSocket-Protocol: v5.channel.k8s.io, v4.channel.k8s.io\r\n"),
        (PORTFORWARD, WS + "Sec-WebSocket-Protocol: SPDY/3.1+portforward.k8s.io\r\n"),
        (EXEC, SPDY + "X-Stream-Protocol-Version: v4.channel.k8s.io\r\n"
         "X-Stream-Protocol-Version: channel.k8s.io\r\n"),
        (PORTFORWARD, SPDY + "X-Stream-Protocol-Version: portforward.k8s.io\r\n"),
    ],
)
async def test_kubernetes_stream_upgrades_are_forwarded(gw: Harness, path: str, upgrade: str
                                                        ) -> None:
    status, _, body = parse_raw(await gw.exchange(get(path, extra=upgrade)))
    assert status == 200
    assert json.loads(body)["target"] == path[len("/c1"):]


# --- an anonymous identity in a TokenReview answer (issue 14 item 4) ----------------------------

ANONYMOUS_TOKEN = "hub-token-ANON-5555555555"
ANONYMOUS_GROUP_TOKEN = "hub-token-ANONGROUP-4444444444"


@pytest.mark.parametrize(
    ("token", "user"),
    [
        (ANONYMOUS_GROUP_TOKEN, {"username": "carol", "uid": "", "extra": {},
                                 "groups": ["system:unauthenticated"]}),
        (ANONYMOUS_GROUP_TOKEN, {"username": "carol", "uid": "", "extra": {},
                                 "groups": ["system:authenticated", "system:unauthenticated"]}),
        (ANONYMOUS_TOKEN, {"username": "system:anonymous", "uid": "", "extra": {},
                           "groups": ["system:unauthenticated"]}),
    ],
)
async def test_rule1_authenticated_review_naming_the_anonymous_group_is_401(
    gw: Harness, monkeypatch: pytest.MonkeyPatch, token: str, user: dict
) -> None:
    monkeypatch.setitem(USERS, token, user)
    status, obj = status_of(await gw.exchange(get("/c1/api/v1/secrets", token=token, close=True)))
    assert status == 401 and obj["reason"] == "Unauthorized"
    assert gw.streams() == []
    assert token in gw.reviewer.seen  # the hub said "authenticated: true"; the gateway refused


# --- request bodies (issue 14 item 8) -----------------------------------------------------------

MiB = 1024 * 1024
LIMIT = 3 * MiB  # the default --max-request-body, kube-apiserver's own


def forwarded_bytes(h: Harness) -> int:
    return sum(len(s.received) for s in h.streams())


async def test_rule7_content_length_over_the_limit_is_413_before_forwarding(gw: Harness) -> None:
    """A 10 MiB POST with Content-Length, as aiohttp sends it (no Expect): 413, not forwarded."""
    connector = aiohttp.TCPConnector(ssl=gw.tls.client)
    async with aiohttp.ClientSession(connector=connector) as client, client.post(
            gw.url + "/c1/api/v1/namespaces/d/configmaps",
            headers={"Authorization": f"Bearer {HUB_TOKEN}"}, data=b"x" * (10 * MiB)) as resp:
        assert resp.status == 413
        obj = await resp.json()
    assert obj["reason"] == "RequestEntityTooLarge" and str(LIMIT) in obj["message"]
    assert gw.streams() == []


async def test_rule7_expect_100_continue_over_the_limit_gets_413_and_no_100(gw: Harness) -> None:
    reader, writer = await gw.open()
    writer.write(get("/c1/api/v1/namespaces/d/configmaps", extra=(
        f"Content-Length: {10 * MiB}\r\nExpect: 100-continue\r\n")).replace(b"GET", b"POST", 1))
    async with asyncio.timeout(5):
        data = await reader.read(-1)  # the gateway answers and closes: no body will come
    writer.close()
    assert data.startswith(b"HTTP/1.1 413 ") and b"100 Continue" not in data
    assert gw.streams() == []


async def test_rule7_curl_large_upload_gets_413(gw: Harness, tmp_path) -> None:
    """curl adds ``Expect: 100-continue`` to a large upload and waits for the 100 first."""
    body = tmp_path / "body"
    body.write_bytes(b"y" * (10 * MiB))
    started = time.monotonic()
    proc = await asyncio.create_subprocess_exec(
        "curl", "-sS", "--cacert", gw.tls.ca_file, "-H", f"Authorization: Bearer {HUB_TOKEN}",
        "-H", "Content-Type: application/json", "--data-binary", f"@{body}",
        "-o", "/dev/null", "-w", "%{http_code}", gw.url + "/c1/api/v1/namespaces/d/configmaps",
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
    out, err = await asyncio.wait_for(proc.communicate(), 20)
    assert out.decode() == "413", err
    assert time.monotonic() - started < 5  # answered at once, not after the 100 wait
    assert gw.streams() == []


async def test_rule7_chunked_body_over_the_limit_is_413_while_streaming(gw: Harness) -> None:
    async def body():
        for _ in range(160):  # 10 MiB in 64 KiB chunks
            yield b"z" * (64 * 1024)

    connector = aiohttp.TCPConnector(ssl=gw.tls.client)
    async with aiohttp.ClientSession(connector=connector) as client:
        try:
            async with client.post(gw.url + "/c1/api/v1/namespaces/d/configmaps",
                                   headers={"Authorization": f"Bearer {HUB_TOKEN}"},
                                   data=body()) as resp:
                status = resp.status
                obj = await resp.json()
        except aiohttp.ClientError as exc:  # pragma: no cover - depends on timing
            pytest.fail(f"the client never saw the 413: {exc!r}")
    assert status == 413 and obj["reason"] == "RequestEntityTooLarge"
    [stream] = gw.streams()
    await stream.wait(lambda: stream.closed)
    assert stream.reset_code is not None  # the upstream request was cancelled
    assert len(stream.received) < LIMIT + 256 * 1024  # at most the limit (+ head, framing)


async def test_rule7_chunked_body_over_the_limit_after_the_response_started_closes(
    gw: Harness,
) -> None:
    """The upstream answered before the body ended: no Status can follow; the gateway resets the
    stream and closes the connection, and the client sees a truncated response, not a 413."""

    async def early_answer(stream) -> None:
        stream.send(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nearly\r\n")
        await stream.wait(lambda: stream.closed, timeout=10)

    gw.connect_cluster("c2", early_answer)
    reader, writer = await gw.open()
    writer.write(b"POST /c2/api/v1/namespaces/d/configmaps HTTP/1.1\r\nHost: h\r\n"
                 b"Authorization: Bearer " + HUB_TOKEN.encode()
                 + b"\r\nTransfer-Encoding: chunked\r\n\r\n")
    async with asyncio.timeout(5):
        head = await reader.readuntil(b"early\r\n")
        assert head.startswith(b"HTTP/1.1 200 ")
        chunk = b"%x\r\n" % MiB + b"q" * MiB + b"\r\n"
        for _ in range(4):
            writer.write(chunk)
        rest = await reader.read(-1)
    writer.close()
    assert b"413" not in rest and b"Status" not in rest
    [stream] = gw.streams("c2")
    assert stream.reset_code is not None


async def test_bodies_up_to_the_limit_pass(gw: Harness) -> None:
    async def chunks():
        for _ in range(3):
            yield b"c" * MiB

    connector = aiohttp.TCPConnector(ssl=gw.tls.client)
    async with aiohttp.ClientSession(connector=connector) as client:
        headers = {"Authorization": f"Bearer {HUB_TOKEN}"}
        url = gw.url + "/c1/api/v1/namespaces/d/configmaps"
        async with client.post(url, headers=headers, data=b"x" * LIMIT) as resp:
            assert resp.status == 200
        async with client.post(url, headers=headers, data=chunks()) as resp:
            assert resp.status == 200
    assert len(gw.streams()) == 2
