"""The gateway's Kubernetes-format audit beside the real managed kube-apiserver's (issue 24).

A gateway runs with ``--audit-log-path``, ``--audit-webhook-config-file`` (a local HTTPS sink
reached through a kubeconfig) and ``--audit-policy-file`` (bob's requests not audited). alice
gets, lists, watches, creates and patches ConfigMaps through it with curl; the managed
kube-apiserver (Metadata policy, blocking log backend) writes its own event for each. For every
request both sides saw, the gateway's event must read as kube-apiserver's: the same field names
(a subset of its), the same verb, objectRef, response code and stages, the same timestamp
format, the user it impersonated being the gateway's user with the prefix. The webhook received
the same events as the log, as EventLists. Refusals the managed side never saw (a bad token, a
hub authorization) are compared with kube-apiserver's own refusal events; no token anywhere.
"""

from __future__ import annotations

import http.server
import json
import re
import ssl
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import trustme
import yaml

from tests.realkube.apiserver import write_private
from tests.realkube.conftest import CLUSTER, PREFIX, Fleet
from tests.realkube.hubproxy import Gateway, start_gateway, wait_connected

ALICE = "system:serviceaccount:fleet:alice"
# Hub groups the gateway does not forward: the managed apiserver adds its own.
DROPPED_GROUPS = {"system:authenticated", "system:unauthenticated"}
MICRO_TIME = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{6}Z$")
POLICY = {"apiVersion": "audit.k8s.io/v1", "kind": "Policy", "rules": [
    {"level": "None", "users": ["system:serviceaccount:fleet:bob"]},
    {"level": "Metadata"},
]}


class Sink(http.server.BaseHTTPRequestHandler):
    """The webhook: records each body and its Authorization header."""

    received: list[tuple[str, dict[str, Any]]] = []

    def do_POST(self) -> None:
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        Sink.received.append((self.headers.get("Authorization", ""), body))
        self.send_response(200)
        self.send_header("Content-Length", "2")
        self.end_headers()
        self.wfile.write(b"{}")

    def log_message(self, *args: Any) -> None:
        pass


@dataclass
class Audited:
    gateway: Gateway
    log: Path
    webhook_token: str


@pytest.fixture(scope="module")
def audited(fleet: Fleet) -> Iterator[Audited]:
    root = fleet.root / "kube-audit"
    root.mkdir()
    ca = trustme.CA()
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ca.issue_cert("127.0.0.1").configure_cert(context)
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Sink)
    server.socket = context.wrap_socket(server.socket, server_side=True)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    ca.cert_pem.write_to_path(str(root / "sink-ca.crt"))
    token = "sink-" + "0123456789abcdef" * 2
    fleet.tokens.append(token)
    kubeconfig = write_private(root / "webhook.kubeconfig", yaml.safe_dump({
        "apiVersion": "v1", "kind": "Config", "current-context": "sink",
        "clusters": [{"name": "sink", "cluster": {
            "server": f"https://127.0.0.1:{server.server_address[1]}/audit",
            "certificate-authority": str(root / "sink-ca.crt")}}],
        "users": [{"name": "gateway", "user": {"token": token}}],
        "contexts": [{"name": "sink", "context": {"cluster": "sink", "user": "gateway"}}]}))
    (root / "policy.yaml").write_text(yaml.safe_dump(POLICY))
    log = root / "audit.log"
    gateway = start_gateway(fleet.group, fleet.pki, fleet.gateway_kubeconfig,
                            fleet.agent_kubeconfig, "--token-cache-ttl", "1s",
                            "--audit-log-path", str(log),
                            "--audit-policy-file", str(root / "policy.yaml"),
                            "--audit-webhook-config-file", str(kubeconfig),
                            "--audit-webhook-batch-max-wait", "200ms")
    try:
        wait_connected(gateway, fleet.alice)
        yield Audited(gateway, log, token)
    finally:
        for process in (gateway.agent, gateway.process):
            if process is not None:
                process.stop()  # SIGTERM: the gateway sends what its webhook buffer holds
        server.shutdown()


def events(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def configmap(name: str) -> str:
    return json.dumps({"apiVersion": "v1", "kind": "ConfigMap",
                       "metadata": {"name": name, "namespace": "team"}, "data": {"k": "v"}})


def test_events_read_as_the_managed_apiservers(fleet: Fleet, audited: Audited) -> None:
    gw, base = audited.gateway, f"/{CLUSTER}/api/v1/namespaces/team/configmaps"
    ua = ("-A", "kubectl/v1.36.0 (linux/amd64) kubernetes/hubproxy-audit-test")
    asked = {
        f"{base}/kaudit-missing": gw.curl(f"{base}/kaudit-missing", fleet.alice, *ua),
        f"{base}?fieldSelector=metadata.name%3Dkaudit-x":
            gw.curl(f"{base}?fieldSelector=metadata.name%3Dkaudit-x", fleet.alice, *ua),
        f"{base}?watch=1&timeoutSeconds=1&labelSelector=kaudit":
            gw.curl(f"{base}?watch=1&timeoutSeconds=1&labelSelector=kaudit", fleet.alice, *ua),
        f"{base}?fieldManager=kaudit": gw.curl(
            f"{base}?fieldManager=kaudit", fleet.alice, *ua, "-X", "POST", "-H",
            "Content-Type: application/json", "-d", configmap("kaudit-made")),
        f"{base}/kaudit-made?fieldManager=kaudit": gw.curl(
            f"{base}/kaudit-made?fieldManager=kaudit", fleet.alice, *ua, "-X", "PATCH", "-H",
            "Content-Type: application/merge-patch+json", "-d", '{"data":{"k":"w"}}'),
    }
    fleet.managed.admin("delete", "configmap", "kaudit-made", "-n", "team")
    assert [code for code, _ in asked.values()] == [404, 200, 200, 201, 200], asked
    time.sleep(0.5)  # the log is written once per loop turn; the webhook batches for 200 ms
    ours = [e for e in events(audited.log) if "kaudit" in e["requestURI"]]
    theirs = [e for e in fleet.managed.audit_events() if "kaudit" in e["requestURI"]
              and e.get("impersonatedUser", {}).get("username") == PREFIX + ALICE]
    for uri in asked:
        mine = [e for e in ours if e["requestURI"] == uri]
        seen = [e for e in theirs if e["requestURI"] == uri[len(CLUSTER) + 1:]]
        assert mine and seen, (uri, ours, theirs)
        assert [e["stage"] for e in mine] == [e["stage"] for e in seen], uri
        for m, t in zip(mine, seen, strict=True):
            assert set(m) <= set(t) | {"annotations"}, set(m) - set(t)
            assert list(m) == [k for k in t if k in m], "field order"
            for key in ("kind", "apiVersion", "level", "stage", "verb", "userAgent"):
                assert m[key] == t[key], (uri, key, m[key], t[key])
            # From the path: all of it but what only the body says (a created object's name).
            assert m["objectRef"].items() <= t["objectRef"].items(), (m, t)
            assert set(t["objectRef"]) - set(m["objectRef"]) <= (
                {"name", "uid", "resourceVersion"} if m["verb"] == "create" else set())
            assert m["responseStatus"]["code"] == t["responseStatus"]["code"]
            assert MICRO_TIME.match(m["requestReceivedTimestamp"])
            assert MICRO_TIME.match(m["stageTimestamp"])
            assert m["requestReceivedTimestamp"] <= t["requestReceivedTimestamp"]
            assert m["stageTimestamp"] >= t["stageTimestamp"] or m["stage"] == "ResponseStarted"
            # The user kube-apiserver saw impersonated is ours, prefixed.
            assert m["user"]["username"] == ALICE
            assert t["impersonatedUser"]["username"] == PREFIX + m["user"]["username"]
            assert {PREFIX + g for g in m["user"]["groups"] if g not in DROPPED_GROUPS} <= \
                set(t["impersonatedUser"]["groups"])
            assert m["sourceIPs"][0] == t["sourceIPs"][0]  # the X-Forwarded-For we sent
            assert m["annotations"] == {"hubproxy.dev/cluster": CLUSTER}
    # The webhook got the same events, in EventLists, with the kubeconfig's credential.
    deadline = time.monotonic() + 10
    while True:
        delivered = [item for _, body in Sink.received for item in body["items"]]
        if all(e in delivered for e in ours) or time.monotonic() > deadline:
            break
        time.sleep(0.1)
    assert all(e in delivered for e in ours)
    assert {body["kind"] for _, body in Sink.received} == {"EventList"}
    assert {auth for auth, _ in Sink.received} == {f"Bearer {audited.webhook_token}"}


def test_refusals_read_as_kube_apiservers_own(fleet: Fleet, audited: Audited) -> None:
    gw = audited.gateway
    bad = "bad-" + "k" * 40
    fleet.tokens.append(bad)
    path = f"/{CLUSTER}/api/v1/namespaces/team/configmaps/kaudit-refused"
    assert gw.curl(path, bad)[0] == 401
    assert gw.curl(path, fleet.bob)[0] == 403  # hub authorization: bob may not use the cluster
    # kube-apiserver's own event for a bad token, for comparison.
    assert fleet.managed.request("GET", "/api/v1/namespaces/team/configmaps/kaudit-direct",
                                 token=bad)[0] == 401
    time.sleep(0.3)
    mine = [e for e in events(audited.log) if e["requestURI"] == path]
    (unauthorized,) = mine  # bob's 403 is not audited: the policy's first rule says None
    (direct,) = [e for e in fleet.managed.audit_events()
                 if e["requestURI"].endswith("/kaudit-direct")]
    assert unauthorized["user"] == direct["user"] == {}
    assert set(unauthorized["responseStatus"]) == set(direct["responseStatus"])
    assert unauthorized["responseStatus"]["reason"] == direct["responseStatus"]["reason"]
    assert unauthorized["responseStatus"]["code"] == 401
    assert unauthorized["verb"] == direct["verb"] == "get"
    text = audited.log.read_text() + gw.logs()
    assert not [i for i, token in enumerate(fleet.tokens) if token in text]
