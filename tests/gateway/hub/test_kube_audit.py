"""Kubernetes-format audit from a gateway on real TLS sockets (gateway.hub.audittrail).

Requests over HTTP/1.1 and HTTP/2 leave ``audit.k8s.io/v1`` events in a log file: the auditID is
the request id the agent receives, the verb and objectRef are read from the path after the
cluster, a watch has ResponseStarted then ResponseComplete, a refusal carries its Status, the
policy decides, no token ever appears (even one copied into the User-Agent), and a webhook that
hangs never holds a request up: its buffer drops, and the drops are counted.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from pathlib import Path
from typing import Any

import pytest

from gateway.hub.audittrail import AuditTrail, KubeAudit
from gateway.ops.k8saudit.backends import LogBackend, WebhookBackend, WebhookSettings
from gateway.ops.k8saudit.policy import AUDIT_EVERYTHING, Policy, policy_from
from tests.gateway.hub.h2client import H2Client
from tests.gateway.hub.test_frontdoor_harness import (
    HUB_TOKEN,
    FakeStream,
    Tls,
    get,
    h2tls,  # noqa: F401  (fixture)
    parse_raw,
    read_response,
    running,
    tls,  # noqa: F401  (fixture)
)

pytestmark = pytest.mark.timeout(30)

ALICE = "system:serviceaccount:team:alice"


def kube_trail(path: Path, policy: Policy = AUDIT_EVERYTHING, *, lines: bool = True
               ) -> AuditTrail:
    return AuditTrail(lines=lines, kube=KubeAudit([LogBackend.to_file(str(path))], policy))


def events(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines()]


async def settle() -> None:
    await asyncio.sleep(0.05)  # the log is written once per loop turn


async def test_a_short_request_leaves_one_event(tls: Tls, tmp_path: Path,  # noqa: F811
                                                caplog: pytest.LogCaptureFixture) -> None:
    log = tmp_path / "audit.log"
    caplog.set_level(logging.INFO, logger="hubproxy.audit")
    async with running(tls, audit_trail=kube_trail(log)) as h:
        h.connect_cluster("c1")
        raw = get("/c1/api/v1/namespaces/team/configmaps/cm1?resourceVersion=0",
                  extra="User-Agent: kubectl/v1.36.0 (linux/amd64)\r\n", close=True)
        status, _, body = parse_raw(await h.exchange(raw))
        assert status == 200
        await settle()
    (event,) = events(log)
    sent = json.loads(body)["metadata"]
    line = next(json.loads(r.getMessage()) for r in caplog.records
            if r.name == "hubproxy.audit")
    # One id end to end: the JSON line's, the agent's, the event's.
    assert event["auditID"] == sent["rid"] == line["request_id"]
    assert event["stage"] == "ResponseComplete"
    assert event["requestURI"] == "/c1/api/v1/namespaces/team/configmaps/cm1?resourceVersion=0"
    assert event["verb"] == "get"
    assert event["objectRef"] == {"resource": "configmaps", "namespace": "team", "name": "cm1",
                                  "apiVersion": "v1"}
    assert event["user"]["username"] == ALICE and event["user"]["uid"] == "uid-a"
    assert "system:authenticated" in event["user"]["groups"]
    assert event["sourceIPs"] == ["127.0.0.1"]
    assert event["userAgent"] == "kubectl/v1.36.0 (linux/amd64)"
    assert event["responseStatus"] == {"metadata": {}, "code": 200}
    assert event["annotations"] == {"hubproxy.dev/cluster": "c1"}
    assert event["requestReceivedTimestamp"] <= event["stageTimestamp"]


async def watch_agent(stream: FakeStream) -> None:
    await stream.request()
    stream.send(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"
                b"b\r\n{\"type\":1}\n\r\n")
    await asyncio.sleep(0.2)
    stream.send(b"0\r\n\r\n")
    stream.send_eof()


async def test_a_watch_has_two_stages(tls: Tls, tmp_path: Path) -> None:  # noqa: F811
    log = tmp_path / "audit.log"
    async with running(tls, audit_trail=kube_trail(log)) as h:
        h.connect_cluster("c1", watch_agent)
        reader, writer = await h.open()
        writer.write(get("/c1/api/v1/namespaces/team/pods?watch=1&timeoutSeconds=5",
                         extra="User-Agent: kubectl/v1.36.0\r\n"))
        status, _, _ = await read_response(reader)
        writer.close()
        assert status == 200
        await settle()
    started, complete = events(log)
    assert (started["stage"], complete["stage"]) == ("ResponseStarted", "ResponseComplete")
    assert started["auditID"] == complete["auditID"]
    assert started["verb"] == complete["verb"] == "watch"
    assert started["requestReceivedTimestamp"] == complete["requestReceivedTimestamp"]
    assert started["stageTimestamp"] < complete["stageTimestamp"]
    # Kept after the head's fields were dropped (a watch may stay open for hours).
    assert complete["userAgent"] == started["userAgent"] == "kubectl/v1.36.0"


async def test_http2_requests_are_audited_alike(h2tls: Tls, tmp_path: Path) -> None:  # noqa: F811
    log = tmp_path / "audit.log"
    async with running(h2tls, audit_trail=kube_trail(log)) as h:
        h.connect_cluster("c1")
        client = await H2Client.connect(h.port, h2tls.ca_file)
        response = await client.request("/c1/apis/apps/v1/namespaces/team/deployments",
                                        token=HUB_TOKEN)
        await client.close()
        assert response.status == 200
        await settle()
    (event,) = events(log)
    assert event["verb"] == "list"
    assert event["objectRef"] == {"resource": "deployments", "namespace": "team",
                                  "apiGroup": "apps", "apiVersion": "v1"}


async def test_refusals_are_audited_without_a_token(tls: Tls, tmp_path: Path) -> None:  # noqa: F811
    log = tmp_path / "audit.log"
    bad = "bad-token-0123456789abcdef"
    async with running(tls, audit_trail=kube_trail(log)) as h:
        h.connect_cluster("c1")
        raw = get("/c1/api/v1/pods", bad, extra="User-Agent: tool/1\r\n", close=True)
        assert parse_raw(await h.exchange(raw))[0] == 401
        # A token copied into the User-Agent by a careless client: refused with 400 before
        # anything else (it would reach the cluster), and kept out of the event.
        for token in (bad, HUB_TOKEN):
            raw = get("/c1/api/v1/pods", token, extra=f"User-Agent: tool/1 {token}\r\n",
                      close=True)
            assert parse_raw(await h.exchange(raw))[0] == 400
        # A cluster that does not exist.
        assert parse_raw(await h.exchange(get("/nowhere/api/v1/pods", close=True)))[0] == 404
        await settle()
    text = log.read_text()
    assert bad not in text and HUB_TOKEN not in text
    unauthorized, copied_bad, copied_good, unknown = events(log)
    assert unauthorized["user"] == {}
    assert unauthorized["userAgent"] == "tool/1"
    assert unauthorized["responseStatus"] == {
        "metadata": {}, "status": "Failure", "message": "invalid bearer token",
        "reason": "Unauthorized", "code": 401}
    assert unauthorized["verb"] == "list" and unauthorized["objectRef"]["resource"] == "pods"
    assert unauthorized["annotations"] == {"hubproxy.dev/cluster": "c1"}
    for copied in (copied_bad, copied_good):
        assert copied["userAgent"] == "REDACTED" and copied["responseStatus"]["code"] == 400
    assert unknown["user"]["username"] == ALICE  # authenticated, then refused
    assert unknown["responseStatus"]["reason"] == "NotFound"


async def test_the_policy_decides(tls: Tls, tmp_path: Path) -> None:  # noqa: F811
    log = tmp_path / "audit.log"
    policy = policy_from({"rules": [
        {"level": "None", "users": [ALICE], "verbs": ["list"]},
        {"level": "Metadata", "clusters": ["c1"]},
    ]})
    async with running(tls, audit_trail=kube_trail(log, policy)) as h:
        h.connect_cluster("c1")
        h.connect_cluster("c2")
        for path in ("/c1/api/v1/pods", "/c1/api/v1/namespaces/team/pods/p",
                     "/c2/api/v1/namespaces/team/pods/p"):
            assert parse_raw(await h.exchange(get(path, close=True)))[0] == 200
        await settle()
    assert [(e["verb"], e["annotations"]["hubproxy.dev/cluster"]) for e in events(log)] == [
        ("get", "c1")]


async def test_a_hanging_webhook_never_holds_a_request(tls: Tls) -> None:  # noqa: F811
    forever = asyncio.Event()
    attempts = 0

    async def hang(body: bytes) -> None:
        nonlocal attempts
        attempts += 1
        await forever.wait()

    backend = WebhookBackend(hang, WebhookSettings(batch_max_size=2, batch_max_wait=0.01,
                                                   buffer_size=5))
    trail = AuditTrail(lines=False, kube=KubeAudit([backend]))
    async with running(tls, audit_trail=trail) as h:
        h.connect_cluster("c1")
        reader, writer = await h.open()
        started = time.monotonic()
        for _ in range(30):
            writer.write(get("/c1/api/v1/pods"))
            status, _, _ = await read_response(reader)
            assert status == 200
        elapsed = time.monotonic() - started
        writer.close()
        assert attempts == 1  # the first batch is still being sent
        dropped = backend.dropped()["buffer_full"]
        assert dropped + len(backend.buffer) + 2 >= 30 and len(backend.buffer) == 5
        metrics = h.gateway.metrics.render().decode()
        assert (f'hubproxy_audit_events_dropped_total{{backend="webhook",reason="buffer_full"}} '
                f'{dropped}') in metrics
        assert 'hubproxy_audit_events_total{backend="webhook"} 0' in metrics
    assert elapsed < 10  # 30 requests; a request never waited for the webhook


async def test_without_kubernetes_audit_nothing_changes(tls: Tls) -> None:  # noqa: F811
    async with running(tls) as h:
        assert h.gateway.audit_trail.kube is None
        assert b"hubproxy_audit_events" not in h.gateway.metrics.render()
