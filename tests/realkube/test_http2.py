"""HTTP/2 at the front door against the real kube-apiserver (issue 15): kubectl (client-go)
negotiates h2 with the gateway for apply, get, list and watch, and each reaches the real
managed apiserver; the gateway's audit line records the protocol of each request."""

from __future__ import annotations

import json
import os
import queue
import subprocess
import threading
import time
from pathlib import Path

import pytest

from tests.realkube.apiserver import KUBECTL
from tests.realkube.conftest import Fleet
from tests.support import eventually_blocking


@pytest.fixture(scope="module")
def alice_h2(fleet: Fleet) -> Path:
    return fleet.user_kubeconfig("alice-h2", fleet.alice)


def protocols(fleet: Fleet, needle: str) -> set[str]:
    found = set()
    for line in fleet.gateway.process.output.splitlines():
        start = line.find("{")
        if start < 0 or needle not in line:
            continue
        try:
            record = json.loads(line[start:])
        except ValueError:
            continue
        if needle in str(record.get("path", "")):
            found.add(record.get("protocol"))
    return found


def eventually(fleet: Fleet, needle: str) -> set[str]:
    return eventually_blocking(lambda: protocols(fleet, needle), 10, f"an audit line for {needle}")


def test_kubectl_speaks_h2_to_the_gateway_for_apply_get_watch(fleet: Fleet, alice_h2: Path) -> None:
    kubectl = fleet.gateway.kubectl
    manifest = json.dumps({"apiVersion": "v1", "kind": "ConfigMap",
                           "metadata": {"name": "h2-applied", "namespace": "team"},
                           "data": {"proto": "h2"}})
    done = kubectl(alice_h2, "apply", "--validate=false", "-f", "-", input=manifest)
    assert done.returncode == 0, done.stderr
    got = kubectl(alice_h2, "get", "configmap", "h2-applied", "-n", "team", "-o", "json")
    assert got.returncode == 0, got.stderr
    assert json.loads(got.stdout)["data"] == {"proto": "h2"}
    assert eventually(fleet, "configmaps/h2-applied") == {"h2"}

    env = {**os.environ, "KUBECONFIG": str(alice_h2), "HOME": str(alice_h2.parent)}
    watcher = subprocess.Popen(
        [KUBECTL, "get", "configmaps", "-n", "team", "-l", "h2w=1", "--watch-only",
         "--output-watch-events", "-o", "custom-columns=TYPE:.type,NAME:.object.metadata.name",
         "--no-headers"], env=env, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    lines: queue.Queue[list[str]] = queue.Queue()
    threading.Thread(target=lambda: [lines.put(ln.split()) for ln in watcher.stdout or []],
                     daemon=True).start()
    try:
        deadline = time.monotonic() + 20
        while not any(e["verb"] == "watch" and e["stage"] == "ResponseStarted"
                      and "h2w" in e.get("requestURI", "")
                      for e in fleet.managed.audit_events()):
            assert time.monotonic() < deadline, "the watch never reached the apiserver"
            time.sleep(0.1)
        fleet.managed.admin("create", "configmap", "h2-watched", "-n", "team",
                            "--from-literal=k=v")
        fleet.managed.admin("label", "configmap", "h2-watched", "-n", "team", "h2w=1")
        assert lines.get(timeout=15) == ["ADDED", "h2-watched"]
    finally:
        watcher.terminate()
        watcher.wait(10)
        fleet.managed.admin("delete", "configmap", "h2-watched", "h2-applied", "-n", "team")
    assert eventually(fleet, "h2w") == {"h2"}
