"""Issue 14, security hardening: each test attacks the gateway through its real TLS front door
(the in-process harness) or a real gateway process, and asserts on what a managed cluster would
have received (nothing, for a refusal) and on the exact answer."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import os
import re
import socket
import ssl
import time
import urllib.request
from pathlib import Path

import aiohttp
import pytest
import yaml

from tests.gateway.hub.test_frontdoor_harness import (
    HUB_TOKEN,
    OTHER_TOKEN,
    USERS,
    Harness,
    get,
    parse_raw,
    running,
    status_of,
    tls,  # noqa: F401
)
from tests.gateway.hub.test_frontdoor_harness import gw as gw
from tests.support import ManualClock

pytestmark = pytest.mark.timeout(60)


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


# --- the hub is not a free oracle (issue 14 item 6) --------------------------------------------


async def test_rule7_failed_authentications_are_rate_limited_per_address(tls) -> None:  # noqa: F811
    clock = ManualClock()  # a refill happens when the test says, however slow the machine
    async with running(tls, auth_failure_burst=3, auth_failure_rate=0.5, clock=clock) as h:
        h.connect_cluster("c1")
        assert parse_raw(await h.exchange(get("/c1/api", close=True)))[0] == 200  # cached now
        reviews = len(h.reviewer.seen)
        answers = [status_of(await h.exchange(get("/c1/api", token=f"guess-{i}", close=True)))
                   for i in range(8)]
        assert [s for s, _ in answers] == [401] * 3 + [429] * 5
        assert len(h.reviewer.seen) == reviews + 3  # the 429s never reached the hub
        status, headers, _ = parse_raw(await h.exchange(get("/c1/api", token="guess-x",
                                                            close=True)))
        assert status == 429 and int(headers["retry-after"]) >= 1
        assert answers[-1][1]["reason"] == "TooManyRequests"
        # a token already cached as valid still passes from the limited address...
        assert parse_raw(await h.exchange(get("/c1/api", close=True)))[0] == 200
        # ...and after the refill (0.5/s) the address may try again: the hub is asked once more
        clock.advance(2.1)
        assert status_of(await h.exchange(get("/c1/api", token="guess-y", close=True)))[0] == 401
        assert h.reviewer.seen[-1] == "guess-y"


async def test_rule7_concurrent_hub_reviews_are_bounded(tls) -> None:  # noqa: F811
    from gateway.hub.admission.hubload import HubCallLimit

    async with running(tls, auth_failure_burst=100) as h:
        h.connect_cluster("c1")
        await asyncio.sleep(0.1)  # the readiness probe's own review is done
        h.gateway.authenticator.hub_calls = HubCallLimit(max_concurrent=2, max_wait=0.2)
        slow_review = h.reviewer.review
        now = peak = 0

        async def review(token: str, audiences: tuple[str, ...]) -> dict:
            nonlocal now, peak
            now += 1
            peak = max(peak, now)
            try:
                await asyncio.sleep(0.6)
                return await slow_review(token, audiences)
            finally:
                now -= 1

        h.reviewer.review = review  # type: ignore[method-assign]
        answers = await asyncio.gather(*(
            h.exchange(get("/c1/api", token=f"random-{i}", close=True)) for i in range(8)))
        statuses = sorted(parse_raw(a)[0] for a in answers)
        assert statuses == [401, 401] + [503] * 6
        assert peak == 2
        for answer in answers:
            status, headers, body = parse_raw(answer)
            if status == 503:
                assert int(headers["retry-after"]) >= 1
                assert json.loads(body)["reason"] == "ServiceUnavailable"


# --- per-identity caps on long-running requests (issue 14 item 7) ------------------------------


async def watch_agent(stream) -> None:
    """A watch stays open (one event, then nothing) until the gateway resets the stream."""
    head, _ = await stream.request()
    if b"watch=" not in head.target:
        body = b'{"kind":"PodList"}'
        stream.send(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n" % len(body) + body)
        stream.send_eof()
        return
    event = b'{"type":"ADDED"}\n'
    stream.send(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"
                + b"%x\r\n" % len(event) + event + b"\r\n")
    await stream.wait(lambda: stream.closed, timeout=30)


async def test_rule7_long_running_requests_capped_per_identity(tls) -> None:  # noqa: F811
    async with running(tls, max_streams_per_identity=2) as h:
        h.connect_cluster("c1", watch_agent)
        watch = "/c1/api/v1/namespaces/d/pods?watch=true"

        async def open_watch(token: str):
            reader, writer = await h.open()
            writer.write(get(watch, token=token))
            async with asyncio.timeout(5):
                head = await reader.readuntil(b"\r\n\r\n")
            return head, writer

        opened = [await open_watch(HUB_TOKEN) for _ in range(2)]
        assert all(head.startswith(b"HTTP/1.1 200") for head, _ in opened)
        status, obj = status_of(await h.exchange(get(watch, close=True)))
        assert status == 429 and "limit 2" in obj["message"]
        _, headers, _ = parse_raw(await h.exchange(get(watch, close=True)))
        assert int(headers["retry-after"]) >= 1
        ws = WS + "Sec-WebSocket-Protocol: v5.channel.k8s.io\r\n"
        assert status_of(await h.exchange(get(EXEC, extra=ws)))[0] == 429  # same cap
        assert len(h.streams()) == 2  # nothing past the cap reached the cluster
        # short requests are not capped, and another identity has its own cap
        assert parse_raw(await h.exchange(get("/c1/api/v1/pods", close=True)))[0] == 200
        other_head, other_writer = await open_watch(OTHER_TOKEN)
        assert other_head.startswith(b"HTTP/1.1 200")
        # closing a watch gives its slot back
        opened[0][1].close()
        alice = h.gateway.stream_quota.identity("system:serviceaccount:team:alice", "")
        async with asyncio.timeout(5):
            while h.gateway.stream_quota.open_count(alice, "c1") != 1:
                await asyncio.sleep(0.01)
        again_head, again_writer = await open_watch(HUB_TOKEN)
        assert again_head.startswith(b"HTTP/1.1 200")
        for writer in (opened[1][1], other_writer, again_writer):
            writer.close()


# --- no token at any log level (issue 14 item 1) ------------------------------------------------


def _tls_request(port: int, ca_file: Path, raw: bytes, timeout: float = 10.0) -> bytes:
    """Send raw bytes over TLS; read the response head (and a little more), then hang up."""
    ctx = ssl.create_default_context(cafile=str(ca_file))
    ctx.check_hostname = False
    with socket.create_connection(("127.0.0.1", port), timeout=timeout) as sock, \
            ctx.wrap_socket(sock, server_hostname="localhost") as conn:
        conn.sendall(raw)
        data = b""
        with contextlib.suppress(TimeoutError, ssl.SSLError, ConnectionError):
            while b"\r\n\r\n" not in data:
                chunk = conn.recv(65536)
                if not chunk:
                    break
                data += chunk
        return data


def _hub_identity(hub, token: str) -> dict:
    """What the hub's TokenReview says about ``token`` (asked directly, as an admin)."""
    review = json.dumps({"apiVersion": "authentication.k8s.io/v1", "kind": "TokenReview",
                         "spec": {"token": token}}).encode()
    ctx = ssl.create_default_context(cafile=hub.ca_file)
    ctx.check_hostname = False
    req = urllib.request.Request(hub.url + "/apis/authentication.k8s.io/v1/tokenreviews",
                                 data=review, method="POST",
                                 headers={"Authorization": f"Bearer {hub.admin_token}",
                                          "Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=10, context=ctx) as resp:
        return json.loads(resp.read())["status"]["user"]


@pytest.mark.timeout(120)
def test_rule5_no_token_or_hub_identity_in_logs_at_debug(tmp_path: Path) -> None:
    """Gateway and agent processes at ``--log-level debug`` (the most verbose setting), every
    kind of token through them: hub (Authorization and WebSocket subprotocol), rejected, the
    gateway's own hub credential, the agent's credential, a passthrough token. Then the whole
    output of both processes (stdout and stderr) is searched."""
    from certs import layout
    from gateway.fixtures import (
        AGENT_USER,
        GATEWAY_USER,
        agent_args,
        agent_kubeconfig,
        gateway_args,
        hub_rbac,
        managed_rbac,
        sample_pod,
        write_private,
    )
    from kubesim.testing import run_kubesim_in_thread
    from tests.support import ProcessGroup, free_port, wait_for_port

    pki = tmp_path / "pki"
    layout.init(pki, layout.InitOptions(clusters=["c1"]))
    gateway_token = "gw-" + os.urandom(12).hex()
    agent_token = "agent-" + os.urandom(12).hex()
    managed_token = "managed-" + os.urandom(12).hex()  # a managed-cluster token: passthrough
    rejected = "rejected-" + os.urandom(12).hex()
    group = ProcessGroup()
    with run_kubesim_in_thread(tmp_path, name="hub", users=[(gateway_token, GATEWAY_USER,
                                                             "gw-uid")],
                               rbac=hub_rbac()) as hub, \
            run_kubesim_in_thread(tmp_path, name="c1",
                                  users=[(agent_token, AGENT_USER, "agent-uid"),
                                         (managed_token, "managed-user", "managed-uid")],
                                  rbac=managed_rbac()) as c1:
        c1.apply(sample_pod())
        user_token = hub.mint_token("demo", "demo", expiration_seconds=3600)
        ws_user_token = hub.mint_token("demo", "demo", expiration_seconds=3601)
        identity = _hub_identity(hub, user_token)
        token_file = write_private(tmp_path / "agent-token", agent_token)
        agent_kc = write_private(tmp_path / "agent.kubeconfig", yaml.safe_dump(
            agent_kubeconfig(c1.url, c1.ca_file, str(token_file))))
        hub_kc = write_private(tmp_path / "hub.kubeconfig",
                               yaml.safe_dump(hub.kubeconfig(gateway_token)))
        front, tunnel = free_port(), free_port()
        try:
            gateway = group.hubproxy(
                *gateway_args(pki, listen=f"127.0.0.1:{front}",
                              tunnel_listen=f"127.0.0.1:{tunnel}",
                              health_listen=f"127.0.0.1:{free_port()}", hub_kubeconfig=hub_kc),
                "--log-level", "debug", "--token-passthrough", "--unknown-cluster-grace", "0")
            wait_for_port(tunnel, timeout=30)
            agent = group.hubproxy(
                *agent_args(pki, "c1", hub=f"127.0.0.1:{tunnel}", kubeconfig=agent_kc,
                            health_listen=f"127.0.0.1:{free_port()}"), "--log-level", "debug")
            ca = pki / "front-ca" / "ca.crt"

            def get(path: str, token: str, extra: str = "") -> bytes:
                return _tls_request(front, ca, (
                    f"GET {path} HTTP/1.1\r\nHost: gw\r\nAuthorization: Bearer {token}\r\n"
                    f"{extra}Connection: close\r\n\r\n").encode())

            deadline = time.monotonic() + 30
            while not get("/c1/api/v1/namespaces/default/pods", user_token).startswith(
                    b"HTTP/1.1 200"):
                assert time.monotonic() < deadline, gateway.output[-3000:] + agent.output[-3000:]
                time.sleep(0.2)
            assert get("/c1/version", rejected).startswith(b"HTTP/1.1 401")
            # the hub rejects it, so it goes through untouched; c1 knows it
            assert get("/c1/api/v1/namespaces/default/pods", managed_token).startswith(
                b"HTTP/1.1 ")
            enc = base64.urlsafe_b64encode(ws_user_token.encode()).rstrip(b"=").decode()
            answer = _tls_request(front, ca, (
                "GET /c1/api/v1/namespaces/default/pods/demo/exec?command=echo&command=hi"
                "&stdout=true HTTP/1.1\r\nHost: gw\r\nUpgrade: websocket\r\n"
                "Connection: Upgrade\r\nSec-WebSocket-Version: 13\r\n"
                "Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n"
                f"Sec-WebSocket-Protocol: base64url.bearer.authorization.k8s.io.{enc},"
                " v5.channel.k8s.io\r\n\r\n").encode())
            assert answer.startswith(b"HTTP/1.1 101"), answer[:300]
            time.sleep(1.0)  # let both processes write what they log about it
        finally:
            group.stop_all()
        logs = gateway.final_output() + "\n" + agent.final_output()
    (tmp_path / "logs.txt").write_text(logs)  # kept by pytest for a failing run
    assert " DEBUG " in logs  # really at debug, and it said something
    assert "c1" in logs
    for secret in (user_token, ws_user_token, enc, gateway_token, agent_token, managed_token,
                   rejected, hub.admin_token, c1.admin_token):
        assert secret not in logs, f"a token ({secret[:6]}...) is in the logs"
    # ...nor a JWT of any kind, nor the hub identity beyond the user name of the audit line
    assert not re.search(r"eyJ[A-Za-z0-9_-]{8,}\.", logs)
    if identity.get("uid"):
        assert identity["uid"] not in logs
    for values in (identity.get("extra") or {}).values():
        for value in values:
            assert value not in logs
