"""`hubproxy demo`: starts everything, prints `hubproxy demo ready`, its kubectl command works
through the gateway, and SIGTERM stops exactly the processes it started."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.support import BackgroundProcess, ProcessGroup, free_port

KUBECTL = shutil.which("kubectl") or "kubectl"


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # a zombie (not yet reaped by its parent) counts as gone
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().split(")")[-1].split()[0] != "Z"
    except OSError:
        return False


@pytest.mark.slow
def test_demo_starts_serves_kubectl_and_stops_on_sigterm(
    processes: ProcessGroup, tmp_path: Path
) -> None:
    port = free_port()
    demo = processes.hubproxy("demo", "--dir", str(tmp_path), "--listen", f"127.0.0.1:{port}")
    try:
        check_demo(demo, tmp_path)
    finally:
        # If the test failed while the demo still ran, stop its children (ours only). Once the
        # demo has exited it has stopped them itself, and their PIDs may already belong to
        # another test's processes: never signal those.
        pid_file = tmp_path / "pids"
        running = demo.popen.poll() is None
        for line in pid_file.read_text().splitlines() if running and pid_file.exists() else []:
            pid = int(line.split()[1])
            if alive(pid):
                os.kill(pid, signal.SIGKILL)


def check_demo(demo: BackgroundProcess, tmp_path: Path) -> None:
    demo.wait_for_line("hubproxy demo ready", timeout=90)
    output = demo.output
    assert f"export KUBECONFIG={tmp_path / 'kubeconfig'}" in output
    assert "kubectl --context cluster1 get pods" in output
    assert "curl --cacert" in output
    for name in ("kubeconfig", "token", "ca.crt"):
        assert (tmp_path / name).is_file()

    env = {**os.environ, "KUBECONFIG": str(tmp_path / "kubeconfig"), "HOME": str(tmp_path)}
    got = subprocess.run([KUBECTL, "--context", "cluster1", "get", "pods"], env=env,
                         capture_output=True, text=True, timeout=60)
    assert got.returncode == 0, got.stderr
    assert "demo" in got.stdout
    whoami = subprocess.run([KUBECTL, "--context", "cluster2", "auth", "whoami"], env=env,
                            capture_output=True, text=True, timeout=60)
    assert whoami.returncode == 0, whoami.stderr
    assert "cluster:hub:system:serviceaccount:demo:demo" in whoami.stdout

    # The headline use case: a ClusterProfile consumer reaches cluster2 through the access
    # provider the gateway published, with the exec plugin (the CRD is in ../shared/crds).
    assert "ClusterProfiles on the hub carry the gateway's access provider" in output
    consumer = subprocess.run([sys.executable, str(tmp_path / "consumer.py"), "cluster2"],
                              capture_output=True, text=True, timeout=60)
    assert consumer.returncode == 0, consumer.stderr
    assert consumer.stdout.split()[:2] == ["cluster2", f"{demo_url(output)}/cluster2"]
    assert "'demo'" in consumer.stdout

    pids = [int(line.split()[1]) for line in (tmp_path / "pids").read_text().splitlines()]
    assert len(pids) == 6  # 3 kubesim, gateway, 2 agents
    assert all(alive(pid) for pid in pids)

    demo.popen.send_signal(signal.SIGTERM)
    assert demo.popen.wait(30) == 0
    deadline = time.monotonic() + 10
    while any(alive(p) for p in pids) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not [p for p in pids if alive(p)]
    assert "hubproxy demo: stopped" in demo.final_output()


@pytest.mark.slow
def test_demo_shows_a_lost_agent_restarts_it_serves_port_forward_and_cleans_up(
    processes: ProcessGroup, tmp_path: Path
) -> None:
    import json
    import re
    import urllib.request

    root = tmp_path / "demo"  # does not exist yet: the demo creates it, so it removes it
    port = free_port()
    demo = processes.hubproxy("demo", "--dir", str(root), "--listen", f"127.0.0.1:{port}",
                              "--agent-restart-delay", "1")
    pids: list[int] = []
    forward: subprocess.Popen[bytes] | None = None
    try:
        demo.wait_for_line("hubproxy demo ready", timeout=90)
        health = re.search(r"hubproxy clusters --url (http://\S+)", demo.output)
        assert health, demo.output
        with urllib.request.urlopen(health.group(1) + "/clusters", timeout=5) as response:
            names = [c["name"] for c in json.loads(response.read())["clusters"]]
        assert names == ["cluster1", "cluster2"]
        pids = [int(line.split()[1]) for line in (root / "pids").read_text().splitlines()]

        # The pod's port 8080 answers HTTP through the gateway's port-forward.
        env = {**os.environ, "KUBECONFIG": str(root / "kubeconfig"), "HOME": str(tmp_path)}
        local = free_port()
        forward = subprocess.Popen([KUBECTL, "--context", "cluster1", "port-forward",
                                    "pod/demo", f"{local}:8080"], env=env,
                                   stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                   start_new_session=True)
        assert forward.stdout is not None
        assert b"Forwarding from" in forward.stdout.readline()
        with urllib.request.urlopen(f"http://127.0.0.1:{local}/hi", timeout=10) as response:
            assert response.status == 200
            assert response.read() == b"hello from pod demo in cluster1 (path /hi)\n"

        # An agent goes: the demo says so, shows the 503, and brings it back.
        agent = [int(line.split()[1]) for line in (root / "pids").read_text().splitlines()
                 if line.startswith("agent-cluster2 ")][-1]
        os.kill(agent, signal.SIGTERM)
        demo.wait_for_line("cluster2 disconnected", timeout=30)
        answer = demo.wait_for_line("GET /cluster2/version now answers", timeout=30)
        assert "answers 503" in answer and "cluster2" in answer
        demo.wait_for_line("cluster2 connected again", timeout=60)
        got = subprocess.run([KUBECTL, "--context", "cluster2", "get", "pods"], env=env,
                             capture_output=True, text=True, timeout=60)
        assert got.returncode == 0 and "demo" in got.stdout, got.stderr
        pids = [int(line.split()[1]) for line in (root / "pids").read_text().splitlines()]
        assert len(pids) == 7  # the restarted agent is recorded too

        demo.popen.send_signal(signal.SIGTERM)
        assert demo.popen.wait(30) == 0
        assert "removed" in demo.final_output()
        assert not root.exists()  # keys and token are gone with it
    finally:
        if forward is not None and forward.poll() is None:
            os.killpg(forward.pid, signal.SIGKILL)
            forward.wait(5)
        # Only while the demo runs are these PIDs surely its children (see above).
        for pid in pids if demo.popen.poll() is None else []:
            if alive(pid):
                os.kill(pid, signal.SIGKILL)


def demo_url(output: str) -> str:
    """The front door URL the demo announced ("... gateway https://HOST:PORT, 2 agents")."""
    return output.split(", gateway ", 1)[1].split(",", 1)[0]
