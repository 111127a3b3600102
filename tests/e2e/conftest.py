"""One running system for all end-to-end tests: kubesim hub + cluster1/cluster2, gateway, agents.

kubesim runs in-process (its own loop in a thread), so tests can read exactly what each
managed cluster received; the gateway and the agents run as real `hubproxy` subprocesses with
real TLS on 127.0.0.1. Started once per session (it takes a few seconds), shared by every test.
Tests that break things (kill an agent) restore them before they return.
"""

from __future__ import annotations

import contextlib
import http.server
import json
import os
import shutil
import socket
import ssl
import subprocess
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import yaml

from certs import layout
from gateway.access.kubeconfig import build_kubeconfig
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
from kubesim.testing import RunningKubeSim, run_kubesim_in_thread
from tests.support import (
    BackgroundProcess,
    ProcessGroup,
    free_port,
    run_kubectl,
    wait_for_port,
)

KUBECTL = shutil.which("kubectl") or "kubectl"
CURL = shutil.which("curl") or "curl"
CLUSTERS = ("cluster1", "cluster2")
SERVICE = ("default", "web", 8080)  # allow-listed on cluster1, served by a local HTTP server


class RecordingHandler(http.server.BaseHTTPRequestHandler):
    """A plain HTTP "Service": answers with the request it saw (to check what crossed)."""

    seen: list[dict[str, Any]] = []

    def do_GET(self) -> None:
        entry = {"path": self.path, "headers": [(k.lower(), v) for k, v in self.headers.items()]}
        RecordingHandler.seen.append(entry)
        body = json.dumps(entry).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: Any) -> None:
        pass


@dataclass
class System:
    root: Path
    pki: Path
    hub: RunningKubeSim
    clusters: dict[str, RunningKubeSim]
    group: ProcessGroup
    front_port: int
    tunnel_port: int
    token: str  # hub token of demo/demo (may use the proxy)
    unprivileged_token: str  # hub token of demo/nobody (may not use the proxy)
    gateway_token: str
    agent_tokens: dict[str, str]
    service_port: int
    gateway: BackgroundProcess | None = None
    agents: dict[str, BackgroundProcess] = field(default_factory=dict)
    agent_health: dict[str, int] = field(default_factory=dict)

    @property
    def front(self) -> str:
        return f"https://127.0.0.1:{self.front_port}"

    @property
    def ca_file(self) -> Path:
        return self.pki / "front-ca" / "ca.crt"

    @property
    def kubeconfig(self) -> Path:
        return self.root / "kubeconfig"

    def env(self, **extra: str) -> dict[str, str]:
        return {**os.environ, "KUBECONFIG": str(self.kubeconfig), "HOME": str(self.root),
                **extra}

    def kubectl(self, *args: str, context: str = "cluster1", timeout: float = 60,
                env: dict[str, str] | None = None,
                input: str | None = None) -> subprocess.CompletedProcess[str]:
        # exec and attach are run again when kubectl hit client-go's exec demux race (see
        # tests.support.CLIENT_GO_DEMUX_RACE): a kubectl flake, not the gateway's.
        return run_kubectl([KUBECTL, "--context", context, *args], env=env or self.env(),
                           timeout=timeout, input=input)

    def kubectl_popen(self, *args: str, context: str = "cluster1",
                      env: dict[str, str] | None = None) -> subprocess.Popen[str]:
        return subprocess.Popen([KUBECTL, "--context", context, *args], env=env or self.env(),
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                start_new_session=True)

    def curl(self, path: str, *args: str, token: str | None = None,
             timeout: float = 30) -> subprocess.CompletedProcess[str]:
        auth = ["-H", f"Authorization: Bearer {token if token is not None else self.token}"]
        if token == "":
            auth = []
        return subprocess.run(
            [CURL, "-sS", "--cacert", str(self.ca_file), "-w", "\n%{http_code}", *auth, *args,
             self.front + path],
            capture_output=True, text=True, timeout=timeout,
        )

    def ssl_context(self) -> ssl.SSLContext:
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
        ctx.load_verify_locations(cafile=str(self.ca_file))
        return ctx

    def raw_request(self, request: bytes, *, timeout: float = 10) -> bytes:
        """Send raw bytes to the front door; returns everything read until close/timeout."""
        with socket.create_connection(("127.0.0.1", self.front_port), timeout=timeout) as raw, \
                self.ssl_context().wrap_socket(raw, server_hostname="localhost") as tls:
            tls.sendall(request)
            chunks = []
            with contextlib.suppress(TimeoutError, ssl.SSLError, ConnectionError):
                while True:
                    data = tls.recv(65536)
                    if not data:
                        break
                    chunks.append(data)
                    if b"\r\n\r\n" in b"".join(chunks) and len(chunks) > 0:
                        head, _, body = b"".join(chunks).partition(b"\r\n\r\n")
                        length = _content_length(head)
                        if length is not None and len(body) >= length:
                            break
            return b"".join(chunks)

    def secrets(self) -> list[str]:
        return [self.token, self.unprivileged_token, self.gateway_token,
                *self.agent_tokens.values(), self.hub.admin_token,
                *(c.admin_token for c in self.clusters.values())]

    def start_agent(self, cluster: str, *extra: str) -> BackgroundProcess:
        kubeconfig = self.root / "agents" / cluster / "kubeconfig"
        health = self.agent_health.setdefault(cluster, free_port())
        args = agent_args(self.pki, cluster, hub=f"127.0.0.1:{self.tunnel_port}",
                          kubeconfig=kubeconfig, health_listen=f"127.0.0.1:{health}")
        if cluster == "cluster1":
            ns, name, port = SERVICE
            args += ["--allow-service", f"{ns}/{name}:{port}", "--allow-loopback-targets",
                     "--service-address", f"{ns}/{name}:{port}=127.0.0.1:{self.service_port}"]
        proc = self.group.hubproxy(*args, *extra)
        self.agents[cluster] = proc
        return proc

    def wait_cluster(self, cluster: str, timeout: float = 30) -> None:
        deadline = time.monotonic() + timeout
        last = ""
        while time.monotonic() < deadline:
            got = self.curl(f"/{cluster}/version", timeout=10)
            last = got.stdout[-300:] + got.stderr[-300:]
            if got.returncode == 0 and got.stdout.rstrip().endswith("200"):
                return
            time.sleep(0.2)
        raise TimeoutError(f"{cluster} not reachable through the gateway: {last}")

    def logs(self) -> str:
        procs = [p for p in (self.gateway, *self.agents.values()) if p is not None]
        procs += [p for p in self.group.started if p not in procs]
        return "\n".join(p.output for p in procs)


def _content_length(head: bytes) -> int | None:
    for line in head.split(b"\r\n")[1:]:
        name, _, value = line.partition(b":")
        if name.strip().lower() == b"content-length":
            return int(value.strip())
    return None


def split_status(result: subprocess.CompletedProcess[str]) -> tuple[int, str]:
    body, _, code = result.stdout.rpartition("\n")
    return int(code or 0), body


@pytest.fixture(scope="session")
def system(tmp_path_factory: pytest.TempPathFactory) -> Iterator[System]:
    root = tmp_path_factory.mktemp("e2e")
    pki = root / "pki"
    layout.init(pki, layout.InitOptions(clusters=[*CLUSTERS, "cluster3"]))
    gateway_token = "gw-" + os.urandom(12).hex()
    agent_tokens = {c: f"agent-{c}-" + os.urandom(12).hex() for c in CLUSTERS}

    service = http.server.ThreadingHTTPServer(("127.0.0.1", 0), RecordingHandler)
    threading.Thread(target=service.serve_forever, daemon=True).start()

    group = ProcessGroup()
    with contextlib.ExitStack() as stack:
        stack.callback(service.shutdown)
        hub = stack.enter_context(run_kubesim_in_thread(
            root, name="hub", users=[(gateway_token, GATEWAY_USER, "gw-uid")], rbac=hub_rbac()))
        clusters = {
            c: stack.enter_context(run_kubesim_in_thread(
                root, name=c, users=[(agent_tokens[c], AGENT_USER, "agent-uid")],
                rbac=managed_rbac()))
            for c in CLUSTERS
        }
        token = hub.mint_token("demo", "demo", expiration_seconds=7200)
        unprivileged = hub.mint_token("demo", "nobody", expiration_seconds=7200)
        for c, sim in clusters.items():
            sim.apply(sample_pod())
            token_file = write_private(root / "agents" / c / "token", agent_tokens[c])
            write_private(root / "agents" / c / "kubeconfig", yaml.safe_dump(
                agent_kubeconfig(sim.url, sim.ca_file, str(token_file))))
        hub_kc = write_private(root / "hub.kubeconfig", yaml.safe_dump(
            hub.kubeconfig(gateway_token)))
        system = System(root, pki, hub, clusters, group, free_port(), free_port(), token,
                        unprivileged, gateway_token, agent_tokens, service.server_address[1])
        write_private(system.kubeconfig, yaml.safe_dump(build_kubeconfig(
            system.front, system.ca_file.read_bytes(), list(CLUSTERS), token=token)))
        stack.callback(group.stop_all)
        system.gateway = group.hubproxy(*gateway_args(
            pki, listen=f"127.0.0.1:{system.front_port}",
            tunnel_listen=f"127.0.0.1:{system.tunnel_port}",
            health_listen=f"127.0.0.1:{free_port()}", hub_kubeconfig=hub_kc))
        try:
            wait_for_port(system.front_port, timeout=20)
            wait_for_port(system.tunnel_port, timeout=20)
        except TimeoutError:
            raise RuntimeError("gateway did not start:\n" + system.gateway.output[-3000:]) from None
        for c in CLUSTERS:
            system.start_agent(c)
        for c in CLUSTERS:
            try:
                system.wait_cluster(c)
            except TimeoutError as exc:
                raise RuntimeError(f"{exc}\n--- logs ---\n{system.logs()[-5000:]}") from None
        yield system
