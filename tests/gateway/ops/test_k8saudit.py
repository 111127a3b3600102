"""Kubernetes-format audit: the policy, the event's format, and the two backends.

The webhook backend is tried against a real HTTPS server (aiohttp, a trustme CA) reached through
a kubeconfig, as kube-apiserver's ``--audit-webhook-config-file``: batches, an outage with
retries and backoff, a buffer that fills and drops (counted) while ``emit`` never waits, a 4xx
that is not retried, and shutdown.
"""

from __future__ import annotations

import asyncio
import json
import ssl
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import trustme
import yaml
from aiohttp import web

from gateway.ops.k8saudit.backends import (
    BUFFER_FULL,
    REJECTED,
    SEND_FAILED,
    SHUTDOWN,
    LogBackend,
    WebhookBackend,
    WebhookError,
    WebhookSettings,
    event_list,
    kubeconfig_sender,
)
from gateway.ops.k8saudit.event import (
    NO_USER,
    RESPONSE_COMPLETE,
    event_line,
    micro_time,
    response_status,
    user_json,
)
from gateway.ops.k8saudit.policy import (
    AUDIT_EVERYTHING,
    METADATA,
    NONE,
    PolicyError,
    load_policy,
    policy_from,
)
from gateway.wire.requestinfo import request_info
from tests.support import free_port

pytestmark = pytest.mark.timeout(30)

# --- policy ---------------------------------------------------------------------------------

POLICY = {
    "apiVersion": "audit.k8s.io/v1", "kind": "Policy",
    "rules": [
        {"level": "None", "users": ["system:serviceaccount:argocd:controller"],
         "verbs": ["watch", "list"]},
        {"level": "None", "clusters": ["lab1"]},
        {"level": "Metadata", "userGroups": ["admins"]},
        {"level": "None", "verbs": ["get"]},
        {"level": "Metadata"},
    ],
}


@pytest.mark.parametrize(("user", "groups", "cluster", "verb", "level"), [
    ("system:serviceaccount:argocd:controller", [], "c1", "watch", NONE),
    ("system:serviceaccount:argocd:controller", [], "c1", "create", METADATA),
    ("alice", ["admins"], "lab1", "create", NONE),  # the first matching rule wins
    ("alice", ["devs", "admins"], "c1", "get", METADATA),
    ("alice", ["devs"], "c1", "get", NONE),
    ("alice", ["devs"], "c1", "delete", METADATA),
    ("", [], "c1", "list", METADATA),  # refused before authentication: no user
])
def test_first_matching_rule_decides(user: str, groups: list[str], cluster: str, verb: str,
                                     level: str) -> None:
    assert policy_from(POLICY).level(user, groups, cluster, verb) == level


def test_no_matching_rule_means_not_audited() -> None:
    policy = policy_from({"rules": [{"level": "Metadata", "users": ["alice"]}]})
    assert policy.level("bob", [], "c1", "get") == NONE
    assert AUDIT_EVERYTHING.level("bob", [], "", "post") == METADATA


@pytest.mark.parametrize(("document", "message"), [
    ({"rules": [{"level": "Request"}]}, "rules[0]: level 'Request' is not supported"),
    ({"rules": [{"level": "RequestResponse"}]}, "never records request or response bodies"),
    ({"rules": [{"level": "Metadata", "resources": [{"resources": ["secrets"]}]}]},
     "rules[0]: field 'resources' is not supported"),
    ({"rules": [{"level": "Metadata", "namespaces": ["x"]}]}, "field 'namespaces'"),
    ({"omitStages": ["RequestReceived"], "rules": [{"level": "Metadata"}]},
     "field 'omitStages' is not supported"),
    ({"rules": [{"level": "None", "users": "alice"}]}, "rules[0].users: expected a list"),
    ({"rules": []}, "rules: expected a non-empty list"),
    ({"kind": "ConfigMap", "rules": [{"level": "None"}]}, "expected Policy"),
    (["rules"], "expected a Policy object"),
])
def test_what_the_subset_cannot_honour_is_refused(document: Any, message: str) -> None:
    with pytest.raises(PolicyError, match=message.replace("[", r"\[").replace("]", r"\]")):
        policy_from(document)


def test_load_policy_from_a_file(tmp_path: Path) -> None:
    path = tmp_path / "policy.yaml"
    path.write_text(yaml.safe_dump(POLICY))
    assert load_policy(str(path)).level("alice", ["devs"], "c1", "get") == NONE
    path.write_text("rules: [")
    with pytest.raises(PolicyError, match="not YAML"):
        load_policy(str(path))
    with pytest.raises(PolicyError, match="cannot read it"):
        load_policy(str(tmp_path / "missing.yaml"))


# --- the event ------------------------------------------------------------------------------


def sample_event(**overrides: Any) -> dict[str, Any]:
    fields: dict[str, Any] = {
        "audit_id": "0123456789abcdef", "stage": RESPONSE_COMPLETE,
        "request_uri": "/c1/api/v1/namespaces/team/pods?watch=1",
        "user": user_json("system:serviceaccount:team:alice", "uid-a",
                          ["system:serviceaccounts", "system:authenticated"],
                          {"authentication.kubernetes.io/pod-name": ["p"]}),
        "source_ips": ("203.0.113.7", "10.0.0.5"), "user_agent": "kubectl/v1.36.0",
        "info": request_info("GET", "/api/v1/namespaces/team/pods?watch=1"),
        "status": response_status(200), "received": 1795774825.443978,
        "now": 1795774826.444814, "cluster": "c1",
    }
    fields.update(overrides)
    return json.loads(event_line(**fields))


def test_event_fields_in_kube_apiservers_order_and_format() -> None:
    event = sample_event()
    assert list(event) == ["kind", "apiVersion", "level", "auditID", "stage", "requestURI",
                           "verb", "user", "sourceIPs", "userAgent", "objectRef",
                           "responseStatus", "requestReceivedTimestamp", "stageTimestamp",
                           "annotations"]
    assert event["kind"] == "Event" and event["apiVersion"] == "audit.k8s.io/v1"
    assert event["level"] == "Metadata"
    assert event["user"] == {"username": "system:serviceaccount:team:alice", "uid": "uid-a",
                             "groups": ["system:serviceaccounts", "system:authenticated"],
                             "extra": {"authentication.kubernetes.io/pod-name": ["p"]}}
    assert event["objectRef"] == {"resource": "pods", "namespace": "team", "apiVersion": "v1"}
    assert event["responseStatus"] == {"metadata": {}, "code": 200}
    assert event["requestReceivedTimestamp"] == "2026-11-27T10:20:25.443978Z"
    assert event["stageTimestamp"] == "2026-11-27T10:20:26.444814Z"


def test_refusals_carry_their_status_and_an_empty_user() -> None:
    event = sample_event(user=NO_USER, status=response_status(401, "invalid bearer token"),
                         info=request_info("GET", "/version"), cluster="", user_agent="")
    assert event["user"] == {}
    assert "objectRef" not in event and "annotations" not in event
    assert "userAgent" not in event
    assert event["verb"] == "get"
    assert event["responseStatus"] == {"metadata": {}, "status": "Failure",
                                       "message": "invalid bearer token",
                                       "reason": "Unauthorized", "code": 401}


def test_micro_time() -> None:
    assert micro_time(0.0) == "1970-01-01T00:00:00.000000Z"
    assert micro_time(1.9999999) == "1970-01-01T00:00:01.999999Z"
    now = time.time()
    assert micro_time(now)[:19] == time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(now))


# --- the log backend ------------------------------------------------------------------------


async def test_log_backend_writes_one_event_per_line(tmp_path: Path) -> None:
    path = tmp_path / "audit.log"
    path.write_text('{"earlier":true}\n')  # appended to, never truncated
    backend = LogBackend.to_file(str(path))
    backend.start()
    for i in range(3):
        backend.emit(json.dumps({"n": i}))
    await asyncio.sleep(0)  # one write per loop turn
    await backend.close()
    assert [json.loads(line) for line in path.read_text().splitlines()] == [
        {"earlier": True}, {"n": 0}, {"n": 1}, {"n": 2}]
    assert backend.events == 3 and backend.dropped() == {}


# --- the webhook backend against a real HTTPS server -----------------------------------------


class Sink:
    """An HTTPS audit sink: records each EventList; ``answers`` scripts its statuses."""

    def __init__(self) -> None:
        self.bodies: list[dict[str, Any]] = []
        self.auth: list[str] = []
        self.answers: list[int] = []
        self.arrived: list[float] = []

    async def handle(self, request: web.Request) -> web.Response:
        self.auth.append(request.headers.get("Authorization", ""))
        self.arrived.append(time.monotonic())
        status = self.answers.pop(0) if self.answers else 200
        if status == 200:
            self.bodies.append(await request.json())
        return web.Response(status=status, text="{}")

    @property
    def items(self) -> list[dict[str, Any]]:
        return [item for body in self.bodies for item in body["items"]]


@pytest.fixture
async def sink(tmp_path: Path) -> AsyncIterator[tuple[Sink, Path]]:
    ca = trustme.CA()
    server_ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ca.issue_cert("127.0.0.1").configure_cert(server_ctx)
    sink = Sink()
    app = web.Application()
    app.router.add_post("/audit", sink.handle)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    port = free_port()
    site = web.TCPSite(runner, "127.0.0.1", port, ssl_context=server_ctx)
    await site.start()
    ca_file = tmp_path / "sink-ca.crt"
    ca.cert_pem.write_to_path(str(ca_file))
    token_file = tmp_path / "sink.token"
    token_file.write_text("sink-token-0123456789")
    kubeconfig = tmp_path / "webhook.kubeconfig"
    kubeconfig.write_text(yaml.safe_dump({
        "apiVersion": "v1", "kind": "Config", "current-context": "audit",
        "clusters": [{"name": "sink", "cluster": {
            "server": f"https://127.0.0.1:{port}/audit",
            "certificate-authority": str(ca_file)}}],
        "users": [{"name": "gw", "user": {"tokenFile": str(token_file)}}],
        "contexts": [{"name": "audit", "context": {"cluster": "sink", "user": "gw"}}],
    }))
    try:
        yield sink, kubeconfig
    finally:
        await runner.cleanup()


async def eventually(predicate: Any, timeout: float = 10.0) -> None:
    async with asyncio.timeout(timeout):
        while not predicate():
            await asyncio.sleep(0.01)


async def test_webhook_posts_event_lists_in_batches(sink: tuple[Sink, Path]) -> None:
    server, kubeconfig = sink
    send, close = await kubeconfig_sender(str(kubeconfig))
    backend = WebhookBackend(send, WebhookSettings(batch_max_size=4, batch_max_wait=0.2),
                             on_close=close)
    backend.start()
    for i in range(10):
        backend.emit(json.dumps({"kind": "Event", "auditID": str(i)}))
    await eventually(lambda: len(server.items) == 10)
    assert [body["kind"] for body in server.bodies] == ["EventList"] * 3
    assert {body["apiVersion"] for body in server.bodies} == {"audit.k8s.io/v1"}
    assert [len(body["items"]) for body in server.bodies] == [4, 4, 2]
    assert [item["auditID"] for item in server.items] == [str(i) for i in range(10)]
    assert set(server.auth) == {"Bearer sink-token-0123456789"}  # the kubeconfig's user
    await backend.close()
    assert backend.events == 10 and backend.dropped() == {}


async def test_webhook_outage_retries_with_backoff_and_drops_past_the_buffer(
        sink: tuple[Sink, Path]) -> None:
    server, kubeconfig = sink
    send, close = await kubeconfig_sender(str(kubeconfig))
    settings = WebhookSettings(batch_max_size=5, batch_max_wait=0.05, buffer_size=20,
                               initial_backoff=0.2, max_attempts=3)
    backend = WebhookBackend(send, settings, on_close=close)
    backend.start()
    server.answers = [503, 503]  # the first batch fails twice, then gets through
    backend.emit('{"n":0}')
    await eventually(lambda: len(server.arrived) >= 1)
    # While the batch is retried, requests keep emitting: emit never waits, and what does not
    # fit in the buffer is dropped and counted.
    started = time.monotonic()
    for i in range(1, 41):
        backend.emit(json.dumps({"n": i}))
    assert time.monotonic() - started < 0.05
    await eventually(lambda: backend.events == 21)
    gaps = [b - a for a, b in zip(server.arrived, server.arrived[1:], strict=False)][:2]
    assert gaps[0] >= 0.2 * 0.8 and gaps[1] >= 0.3 * 0.8  # backoff grows by 1.5
    assert backend.dropped() == {BUFFER_FULL: 20}
    assert [item["n"] for item in server.items] == list(range(21))
    await backend.close()


async def test_webhook_gives_up_after_its_attempts_and_on_a_4xx(sink: tuple[Sink, Path]
                                                                ) -> None:
    server, kubeconfig = sink
    send, close = await kubeconfig_sender(str(kubeconfig))
    backend = WebhookBackend(send, WebhookSettings(batch_max_size=2, batch_max_wait=0.01,
                                                   initial_backoff=0.01, max_attempts=3),
                             on_close=close)
    backend.start()
    server.answers = [500, 500, 500, 400]
    for i in range(4):
        backend.emit(json.dumps({"n": i}))
    await eventually(lambda: sum(backend.dropped().values()) == 4)
    assert backend.dropped() == {SEND_FAILED: 2, REJECTED: 2}
    assert len(server.arrived) == 4  # three attempts, then one (a 400 is not retried)
    await backend.close()


async def test_webhook_unreachable_then_shutdown_counts_what_is_lost() -> None:
    attempts = 0

    async def refused(body: bytes) -> None:
        nonlocal attempts
        attempts += 1
        raise ConnectionRefusedError

    backend = WebhookBackend(refused, WebhookSettings(batch_max_size=2, batch_max_wait=0.01,
                                                      initial_backoff=5, max_attempts=5))
    backend.start()
    for i in range(5):
        backend.emit(str(i))
    await eventually(lambda: attempts == 1)
    started = time.monotonic()
    await backend.close(timeout=0.2)
    assert time.monotonic() - started < 2
    backend.emit("late")
    assert backend.dropped() == {SHUTDOWN: 6}


def test_webhook_error_says_what_is_retried() -> None:
    assert WebhookError(503).retryable and WebhookError(429).retryable
    assert not WebhookError(400).retryable and not WebhookError(413).retryable


def test_event_list_wraps_serialized_events() -> None:
    assert json.loads(event_list(['{"a":1}', '{"b":2}'])) == {
        "kind": "EventList", "apiVersion": "audit.k8s.io/v1", "metadata": {},
        "items": [{"a": 1}, {"b": 2}]}
