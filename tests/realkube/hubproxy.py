"""hubproxy gateway + agent processes in front of the real apiservers, and clients for them.

Everything runs as a process (`python -m gateway.cli ...` through `ProcessGroup.hubproxy`), and
clients are real `curl` and `kubectl`: the tier imports nothing from ``gateway``.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from tests.realkube.apiserver import KUBECTL, write_private
from tests.support import LOOPBACK, BackgroundProcess, ProcessGroup, free_port, wait_for_port

CURL = shutil.which("curl") or "curl"
CLUSTER = "cluster1"


def init_pki(root: Path) -> Path:
    """`hubproxy certs init` with one agent certificate for CLUSTER."""
    subprocess.run([sys.executable, "-m", "gateway.cli", "certs", "init", str(root),
                    "--cluster", CLUSTER], check=True, capture_output=True, timeout=60)
    return root


@dataclass
class Gateway:
    """One gateway process and the agent that dials it."""

    pki: Path
    front_port: int
    process: BackgroundProcess
    agent: BackgroundProcess | None = None

    @property
    def front(self) -> str:
        return f"https://{LOOPBACK}:{self.front_port}"

    @property
    def ca_file(self) -> Path:
        return self.pki / "front-ca" / "ca.crt"

    def curl(self, path: str, token: str | None, *args: str,
             ca_file: Path | None = None) -> tuple[int, str]:
        """(HTTP status, body) of one curl request; token None sends no Authorization."""
        auth = ["-H", f"Authorization: Bearer {token}"] if token is not None else []
        done = subprocess.run(
            [CURL, "-sS", "--cacert", str(ca_file or self.ca_file), "-w", "\n%{http_code}",
             *auth, *args, self.front + path],
            capture_output=True, text=True, timeout=30)
        body, _, code = done.stdout.rpartition("\n")
        return int(code or 0), body

    def curl_json(self, path: str, token: str | None, *args: str) -> tuple[int, Any]:
        code, body = self.curl(path, token, *args)
        return code, json.loads(body) if body.strip() else None

    def kubeconfig(self, path: Path, token: str) -> Path:
        """What a user of the gateway has: its URL for CLUSTER, the front CA, a hub token."""
        config = {
            "apiVersion": "v1", "kind": "Config", "current-context": CLUSTER,
            "clusters": [{"name": CLUSTER, "cluster": {
                "server": f"{self.front}/{CLUSTER}", "certificate-authority": str(self.ca_file)}}],
            "users": [{"name": "hub-user", "user": {"token": token}}],
            "contexts": [{"name": CLUSTER, "context": {"cluster": CLUSTER, "user": "hub-user"}}],
        }
        return write_private(path, yaml.safe_dump(config))

    def kubectl(self, kubeconfig: Path, *args: str, input: str | None = None,
                timeout: float = 60) -> subprocess.CompletedProcess[str]:
        env = {**os.environ, "KUBECONFIG": str(kubeconfig), "HOME": str(kubeconfig.parent)}
        return subprocess.run([KUBECTL, *args], env=env, input=input, capture_output=True,
                              text=True, timeout=timeout)

    def logs(self) -> str:
        return "\n".join(p.output for p in (self.process, self.agent) if p is not None)


def start_gateway(group: ProcessGroup, pki: Path, hub_kubeconfig: Path,
                  agent_kubeconfig: Path, *extra: str, front_port: int = 0,
                  agent_args: tuple[str, ...] = ("--health-listen", "off")) -> Gateway:
    """A gateway on free loopback ports, then an agent for CLUSTER dialling it (with
    ``agent_args`` added to its command line)."""
    front, tunnel = front_port or free_port(), free_port()
    process = group.hubproxy(
        "gateway", "--listen", f"{LOOPBACK}:{front}", "--tunnel-listen", f"{LOOPBACK}:{tunnel}",
        "--health-listen", "off", "--tls-dir", str(pki / "gateway"),
        "--tunnel-tls-dir", str(pki / "tunnel-server"),
        "--agent-ca", str(pki / "tunnel-ca" / "ca.crt"),
        "--hub-kubeconfig", str(hub_kubeconfig), *extra)
    gateway = Gateway(pki, front, process)
    try:
        wait_for_port(front, timeout=30)
        wait_for_port(tunnel, timeout=30)
    except TimeoutError:
        raise RuntimeError(f"gateway did not start:\n{process.output[-3000:]}") from None
    gateway.agent = group.hubproxy(
        "agent", "--hub", f"{LOOPBACK}:{tunnel}", "--cluster", CLUSTER,
        "--tls-dir", str(pki / "agents" / CLUSTER), "--kubeconfig", str(agent_kubeconfig),
        "--drain-timeout", "2", *agent_args)
    return gateway


def wait_connected(gateway: Gateway, token: str, timeout: float = 30.0) -> None:
    """Until a request with ``token`` reaches CLUSTER's apiserver through the tunnel."""
    deadline = time.monotonic() + timeout
    last: tuple[int, str] = (0, "")
    while time.monotonic() < deadline:
        last = gateway.curl(f"/{CLUSTER}/version", token)
        if last[0] == 200:
            return
        time.sleep(0.2)
    raise RuntimeError(f"{CLUSTER} not reachable through the gateway ({last[0]} {last[1][:300]})"
                       f"\n--- logs ---\n{gateway.logs()[-4000:]}")
