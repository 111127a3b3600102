"""Ask the real kube-apiserver what it makes of a request: does it start a watch, a follow, and
does it count it as long-running? (issue 25: ``gateway.wire.requestclass`` must agree.)

Three observations, none of them a guess from the response alone:

* the **audit verb** (``watch``, ``list``, ``get``...) that kube-apiserver's RequestInfo gave
  the request, read from its audit log by the request's ``Audit-Id``;
* **long-running**: kube-apiserver writes a ``ResponseStarted`` audit event only for a request
  its LongRunningFunc calls long-running (the same function that exempts it from the request
  timeout and from max-in-flight);
* **follow**: a pod's log is fetched from its node's kubelet. No kubelet runs here, so the pod
  is bound to a Node whose kubelet endpoint is :class:`FakeKubelet` on loopback, which records
  the query kube-apiserver sends it: ``follow=true`` there is kube-apiserver's decision.
"""

from __future__ import annotations

import http.client
import http.server
import json
import ssl
import threading
import time
from dataclasses import dataclass
from typing import Any

import trustme

from tests.gateway.wire.test_requestclass import CONFIGMAP, NAMESPACE, POD
from tests.realkube.apiserver import RealKube
from tests.support import LOOPBACK

NODE = "longrunning-node"


@dataclass(frozen=True)
class Observation:
    status: int
    verb: str  # the audit verb
    long_running: bool  # a ResponseStarted audit event was written


class FakeKubelet:
    """A TLS server on loopback standing in for a node's kubelet: answers every request with
    one log line and records the request-targets it was asked for."""

    def __init__(self) -> None:
        ca = trustme.CA()
        cert = ca.issue_cert(LOOPBACK)
        context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        cert.configure_cert(context)
        self.targets: list[str] = []
        targets = self.targets

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                targets.append(self.path)
                body = b"a log line\n"
                self.send_response(200)
                self.send_header("Content-Type", "text/plain")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args: Any) -> None:
                return None

        self.server = http.server.ThreadingHTTPServer((LOOPBACK, 0), Handler)
        self.server.socket = context.wrap_socket(self.server.socket, server_side=True)
        self.port = int(self.server.server_address[1])
        self._thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self._thread.start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def set_up(kube: RealKube, kubelet: FakeKubelet) -> None:
    """A namespace with one ConfigMap, and a pod bound to a Node served by ``kubelet``."""
    kube.apply([
        {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NAMESPACE}},
        # No controller-manager creates it here; the ServiceAccount admission plugin needs it.
        {"apiVersion": "v1", "kind": "ServiceAccount",
         "metadata": {"name": "default", "namespace": NAMESPACE}},
        {"apiVersion": "v1", "kind": "ConfigMap",
         "metadata": {"name": CONFIGMAP, "namespace": NAMESPACE}, "data": {"k": "v"}},
        {"apiVersion": "v1", "kind": "Node", "metadata": {"name": NODE}},
    ])
    status, body = kube.request("PATCH", f"/api/v1/nodes/{NODE}/status", {"status": {
        "addresses": [{"type": "InternalIP", "address": LOOPBACK}],
        "daemonEndpoints": {"kubeletEndpoint": {"Port": kubelet.port}}}},
        headers={"Content-Type": "application/merge-patch+json"})
    assert status == 200, body
    kube.apply({"apiVersion": "v1", "kind": "Pod",
                "metadata": {"name": POD, "namespace": NAMESPACE},
                "spec": {"nodeName": NODE, "automountServiceAccountToken": False,
                         "containers": [{"name": "c", "image": "none.invalid/none"}]}})


def observe(kube: RealKube, method: str, target: str) -> Observation:
    """Send one request as the admin, read its head (a watch is then abandoned) and look its
    audit events up. With the blocking audit backend they are on disk before the head is sent:
    ``ResponseStarted`` for a long-running request, ``ResponseComplete`` for any other."""
    context = ssl.create_default_context(cafile=str(kube.ca_file))
    conn = http.client.HTTPSConnection(LOOPBACK, kube.port, context=context, timeout=30)
    try:
        conn.request(method, target, headers={"Authorization": f"Bearer {kube.admin_token}",
                                              "Accept": "application/json"})
        response = conn.getresponse()
        audit_id = response.getheader("Audit-Id") or ""
        status = response.status
    finally:
        conn.close()
    assert audit_id, f"{method} {target}: no Audit-Id"
    stages = _stages(kube, audit_id)
    assert stages, f"{method} {target}: no audit event for {audit_id}"
    verb = next(iter(stages.values()))["verb"]
    return Observation(status, verb, "ResponseStarted" in stages)


def _stages(kube: RealKube, audit_id: str, timeout: float = 10.0) -> dict[str, dict[str, Any]]:
    """The audit events of one request written so far, by stage."""
    deadline = time.monotonic() + timeout
    while True:
        stages = {event["stage"]: event for event in
                  (json.loads(line) for line in kube.audit_lines() if audit_id in line)
                  if event.get("auditID") == audit_id}
        if stages or time.monotonic() > deadline:
            return stages
        time.sleep(0.05)


def tear_down(kube: RealKube) -> None:
    """Remove the pod (at once: no kubelet will confirm) and the Node; the namespace stays (no
    namespace controller runs here to finish deleting it)."""
    kube.admin("delete", "pod", POD, "-n", NAMESPACE, "--grace-period=0", "--force",
               "--ignore-not-found")
    kube.admin("delete", "node", NODE, "--ignore-not-found")
