"""The configurations the gateway benchmark compares, all in front of the same upstream.

Each ``start_*`` function starts its processes through :class:`bench.procs.Procs` (PIDs recorded,
stopped by PID), waits until a real request succeeds, and returns a :class:`Config`: how a client
reaches it and which processes are "the proxy" (for CPU and memory figures). A configuration whose
tool is missing is not started; :func:`missing_tools` says why.
"""

from __future__ import annotations

import secrets
import shutil
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from bench import nginx
from bench.loadgen import Target, curl
from bench.procs import LOOPBACK, Proc, Procs, free_port, wait_for_port
from bench.procstats import tree

KUBECTL = shutil.which("kubectl")
POD_PATH = "/api/v1/namespaces/default/pods/bench"
CLUSTER = "bench"
RELAY_CLUSTER = "relay"
BENCH_USER = "bench-user"
GATEWAY_USER = "hubproxy-gateway"


@dataclass
class Config:
    name: str
    target: Target
    note: str
    # role -> PIDs (e.g. {"gateway": [..], "agent": [..]}); "proxy" totals are their sum.
    roles: dict[str, list[int]] = field(default_factory=dict)
    procs: list[Proc] = field(default_factory=list)
    extra: bool = False  # measured on small GETs and large bodies only

    def pids(self) -> list[int]:
        return [p for pids in self.roles.values() for p in pids]


@dataclass
class Lab:
    """Shared files: certificates, kubeconfigs, tokens."""

    root: Path
    procs: Procs
    pki: Path = field(init=False)
    upstream_dir: Path = field(init=False)
    upstream_port: int = 0
    upstream_workers: list[int] = field(default_factory=list)
    upstream_stats: Path = field(init=False)  # the workers' connection counts (SIGUSR1)
    bench_token: str = field(default_factory=lambda: "bench-" + secrets.token_hex(16))
    agent_token: str = field(default_factory=lambda: "agent-" + secrets.token_hex(16))
    gateway_token: str = field(default_factory=lambda: "gw-" + secrets.token_hex(16))
    hub_kubeconfig: Path | None = None

    def __post_init__(self) -> None:
        self.pki = self.root / "pki"
        self.upstream_dir = self.root / "upstream-tls"
        self.upstream_stats = self.root / "upstream-stats"

    def make_certs(self) -> None:
        """``hubproxy certs init`` layout (agents bench and relay) + a separate upstream CA."""
        from certs import layout
        from certs.files import cert_pem, write_pair
        from certs.issue import create_ca, issue_server

        layout.init(self.pki, layout.InitOptions(clusters=[CLUSTER, RELAY_CLUSTER]))
        self.upstream_dir.mkdir(parents=True)
        ca = create_ca("bench upstream CA", days=2)
        (self.upstream_dir / "ca.crt").write_bytes(cert_pem(ca.cert))
        write_pair(self.upstream_dir, issue_server(ca, "upstream", ["localhost", LOOPBACK],
                                                    days=2), ca.cert, force=True)

    @property
    def upstream_ca(self) -> str:
        return str(self.upstream_dir / "ca.crt")

    def upstream_kubeconfig(self) -> Path:
        """server = the upstream, with a token (what kubectl proxy and the agents use)."""
        path = self.root / "upstream.kubeconfig"
        if not path.exists():
            token_file = self.root / "agent.token"
            token_file.write_text(self.agent_token)
            token_file.chmod(0o600)
            path.write_text(yaml.safe_dump({
                "apiVersion": "v1", "kind": "Config", "current-context": "up",
                "clusters": [{"name": "up", "cluster": {
                    "server": f"https://{LOOPBACK}:{self.upstream_port}",
                    "certificate-authority": self.upstream_ca}}],
                "users": [{"name": "up", "user": {"tokenFile": str(token_file)}}],
                "contexts": [{"name": "up", "context": {"cluster": "up", "user": "up"}}],
            }))
            path.chmod(0o600)
        return path


def missing_tools() -> dict[str, str]:
    """Configuration name -> why it cannot run here."""
    out = {}
    if nginx.NGINX is None:
        out["nginx"] = f"nginx not installed ({nginx.INSTALL_HINT})"
    if KUBECTL is None:
        out["kubectl-proxy"] = "kubectl not installed"
    return out


def _wait_ok(cfg: Config, timeout: float = 30.0) -> None:
    """Until a real GET through ``cfg`` answers 200 (also warms caches and pools)."""
    deadline = time.monotonic() + timeout
    last = ""
    while time.monotonic() < deadline:
        try:
            curl(cfg.target, POD_PATH, timeout=5)
            return
        except RuntimeError as exc:
            last = str(exc)
        for proc in cfg.procs:
            if not proc.alive():
                raise RuntimeError(f"{proc.name} exited:\n{proc.output()}")
        time.sleep(0.1)
    logs = "\n".join(f"--- {p.name}\n{p.output(2000)}" for p in cfg.procs)
    raise RuntimeError(f"{cfg.name} not answering within {timeout:g}s: {last}\n{logs}")


def start_upstream(lab: Lab, workers: int) -> Config:
    lab.upstream_port = free_port()
    d = lab.upstream_dir
    lab.upstream_stats.mkdir(exist_ok=True)
    proc = lab.procs.start("upstream", [
        sys.executable, "-m", "bench.upstream", "--listen", f"{LOOPBACK}:{lab.upstream_port}",
        "--cert", str(d / "tls.crt"), "--key", str(d / "tls.key"), "--workers", str(workers),
        "--stats-dir", str(lab.upstream_stats)])
    line = proc.wait_for_line("upstream ready on", 30)
    lab.upstream_workers = [int(x) for x in line.split("workers", 1)[1].split()]
    cfg = Config("direct", Target(f"https://{LOOPBACK}:{lab.upstream_port}", lab.upstream_ca),
                 f"client -> upstream (TLS, ALPN h2 + http/1.1, {workers} worker processes)",
                 {"upstream": lab.upstream_workers}, [proc])
    _wait_ok(cfg)
    return cfg


def start_nginx(lab: Lab, workers: str = "1", name: str = "nginx") -> tuple[Config, Target]:
    """The proxy config and the static-file target (nginx serving /bench.json itself)."""
    prefix = lab.root / name
    port, static = free_port(), free_port()
    gw = lab.pki / "gateway"
    conf = nginx.write_config(prefix, workers=workers, proxy_port=port, static_port=static,
                              upstream_port=lab.upstream_port, cert=str(gw / "tls.crt"),
                              key=str(gw / "tls.key"), upstream_ca=lab.upstream_ca)
    proc = lab.procs.start(name, nginx.command(prefix, conf))
    wait_for_port(port)
    time.sleep(0.2)  # workers forked
    ca = str(lab.pki / "gateway" / "ca.crt")
    cfg = Config(name, Target(f"https://{LOOPBACK}:{port}", ca),
                 f"nginx TLS reverse proxy, worker_processes {workers}, keepalive upstream, "
                 "buffering off", {"nginx": tree(proc.pid)}, [proc], extra=workers != "1")
    _wait_ok(cfg)
    cfg.roles["nginx"] = tree(proc.pid)
    return cfg, Target(f"https://{LOOPBACK}:{static}", ca)


def start_kubectl_proxy(lab: Lab) -> Config:
    assert KUBECTL is not None
    port = free_port()
    proc = lab.procs.start("kubectl-proxy", [
        KUBECTL, "--kubeconfig", str(lab.upstream_kubeconfig()), "proxy", f"--port={port}",
        f"--address={LOOPBACK}", r"--accept-hosts=^127\.0\.0\.1$"])
    proc.wait_for_line("Starting to serve", 30)
    cfg = Config("kubectl-proxy", Target(f"http://{LOOPBACK}:{port}"),
                 "kubectl proxy; plain HTTP on the client side (as users run it), TLS upstream",
                 {"kubectl": [proc.pid]}, [proc])
    _wait_ok(cfg)
    return cfg


def start_aiohttp_proxy(lab: Lab) -> Config:
    """``bench.naiveproxy``: the single-hop aiohttp proxy anyone would write first."""
    port = free_port()
    gw = lab.pki / "gateway"
    proc = lab.procs.start("aiohttp-proxy", [
        sys.executable, "-m", "bench.naiveproxy", "--listen", f"{LOOPBACK}:{port}",
        "--cert", str(gw / "tls.crt"), "--key", str(gw / "tls.key"),
        "--upstream", f"https://{LOOPBACK}:{lab.upstream_port}",
        "--upstream-ca", lab.upstream_ca])
    proc.wait_for_line("naiveproxy ready", 30)
    cfg = Config("aiohttp-proxy", Target(f"https://{LOOPBACK}:{port}", str(gw / "ca.crt")),
                 "naive aiohttp reverse proxy (uvloop, one keep-alive ClientSession, streamed), "
                 "TLS both sides", {"aiohttp": [proc.pid]}, [proc], extra=True)
    _wait_ok(cfg)
    return cfg


def start_hop_floor(lab: Lab) -> Config:
    """``bench.hopfloor`` twice in series: the floor of hubproxy's two TLS-terminating hops."""
    gw = lab.pki / "gateway"
    upstream = f"https://{LOOPBACK}:{lab.upstream_port}"
    procs, ca = [], lab.upstream_ca
    for name in ("floor-hop2", "floor-hop1"):  # the apiserver's side first
        port = free_port()
        proc = lab.procs.start(name, [
            sys.executable, "-m", "bench.hopfloor", "--listen", f"{LOOPBACK}:{port}",
            "--cert", str(gw / "tls.crt"), "--key", str(gw / "tls.key"),
            "--upstream", upstream, "--upstream-ca", ca])
        proc.wait_for_line("hopfloor ready", 30)
        procs.append(proc)
        upstream, ca = f"https://{LOOPBACK}:{port}", str(gw / "ca.crt")
    cfg = Config("floor-2hop", Target(upstream, ca),
                 "two bench.hopfloor processes in series, each terminating TLS on both sides "
                 "and relaying HTTP/1.1 messages by their framing only: the least hubproxy's "
                 "two hops cost in Python", {"hop1": [procs[1].pid], "hop2": [procs[0].pid]},
                 procs, extra=True)
    _wait_ok(cfg)
    return cfg


def _hubproxy(*args: str) -> list[str]:
    return [sys.executable, "-m", "gateway.cli", *args]


def start_hub_stub(lab: Lab, users: list[tuple[str, str, str, str]] | None = None) -> Proc:
    """kubesim as the hub: answers the gateway's TokenReviews (static token file + RBAC).
    ``users``: (token, name, uid, group) of the callers it knows; default the bench user."""
    port = free_port()
    tokens = lab.root / "hub-tokens.csv"
    if users is None:
        users = [(lab.bench_token, BENCH_USER, "bench-uid", "bench-group")]
    tokens.write_text(f"{lab.gateway_token},{GATEWAY_USER},gw-uid,\n"
                      + "".join(f"{','.join(user)}\n" for user in users))
    tokens.chmod(0o600)
    rbac = lab.root / "hub-rbac.yaml"
    rbac.write_text(yaml.safe_dump_all([
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole",
         "metadata": {"name": "hubproxy-gateway"},
         "rules": [{"apiGroups": ["authentication.k8s.io"], "resources": ["tokenreviews"],
                    "verbs": ["create"]},
                   {"apiGroups": ["authorization.k8s.io"], "resources": ["subjectaccessreviews"],
                    "verbs": ["create"]}]},
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding",
         "metadata": {"name": "hubproxy-gateway"},
         "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole",
                     "name": "hubproxy-gateway"},
         "subjects": [{"kind": "User", "name": GATEWAY_USER,
                       "apiGroup": "rbac.authorization.k8s.io"}]},
    ]))
    proc = lab.procs.start("hub-kubesim", [
        sys.executable, "-m", "kubesim", "--listen", f"{LOOPBACK}:{port}",
        "--cert-dir", str(lab.root / "hub-tls"), "--token-auth-file", str(tokens),
        "--rbac-file", str(rbac), "--name", "hub"])
    proc.wait_for_line("kubesim ready on", 30)
    kc = lab.root / "hub.kubeconfig"
    kc.write_text(yaml.safe_dump({
        "apiVersion": "v1", "kind": "Config", "current-context": "hub",
        "clusters": [{"name": "hub", "cluster": {
            "server": f"https://{LOOPBACK}:{port}",
            "certificate-authority": str(lab.root / "hub-tls" / "ca.crt")}}],
        "users": [{"name": "gw", "user": {"token": lab.gateway_token}}],
        "contexts": [{"name": "hub", "context": {"cluster": "hub", "user": "gw"}}],
    }))
    kc.chmod(0o600)
    lab.hub_kubeconfig = kc
    return proc


def start_hubproxy(lab: Lab, log_level: str = "info", upstream_connections: int = 2048,
                   workers: int = 1, name: str = "hubproxy",
                   gateway_args: Sequence[str] = (),
                   agent_args: Sequence[str] = (), code_tree: Path | None = None,
                   extra: bool | None = None) -> Config:
    """``hubproxy gateway`` + ``hubproxy agent`` (cluster bench), exactly as deployed
    (``gateway_args``, ``agent_args``: more flags for the gateway, the agent; e.g.
    ``--apiserver-protocol h2``). ``code_tree``: run the gateway and agent of another checkout
    (an older commit, measured side by side with this one); ``extra``: measured on fewer
    workloads (default: every name but ``hubproxy``)."""
    hub = start_hub_stub(lab)
    # Another checkout's code: its directory first on the path, and as the working directory.
    from_tree: dict[str, Any] = {} if code_tree is None else {
        "env": {"PYTHONPATH": str(code_tree)}, "cwd": code_tree}
    front, tunnel = free_port(), free_port()
    suffix = "" if name == "hubproxy" else f"-{name}"
    gateway = lab.procs.start(f"gateway{suffix}", _hubproxy(
        "gateway", "--listen", f"{LOOPBACK}:{front}", "--tunnel-listen", f"{LOOPBACK}:{tunnel}",
        "--health-listen", f"{LOOPBACK}:{free_port()}", "--tls-dir", str(lab.pki / "gateway"),
        "--tunnel-tls-dir", str(lab.pki / "tunnel-server"),
        "--agent-ca", str(lab.pki / "tunnel-ca" / "ca.crt"),
        "--hub-kubeconfig", str(lab.hub_kubeconfig),
        "--authorize", "none", "--token-cache-ttl", "1h", "--max-connections", "30000",
        "--max-inflight", "30000", "--workers", str(workers), "--log-level", log_level,
        # One identity holds every watch of the idle-watch measurement.
        "--max-streams-per-identity", "30000", *gateway_args), **from_tree)
    gateway.wait_for_line("hubproxy gateway ready", 30)
    agent = lab.procs.start(f"agent{suffix}", _hubproxy(
        "agent", "--hub", f"{LOOPBACK}:{tunnel}", "--cluster", CLUSTER,
        "--tls-dir", str(lab.pki / "agents" / CLUSTER),
        "--kubeconfig", str(lab.upstream_kubeconfig()), "--health-listen", "off",
        "--max-upstream-connections", str(upstream_connections), "--log-level", log_level,
        *agent_args), **from_tree)
    cfg = Config(name, Target(f"https://{LOOPBACK}:{front}/{CLUSTER}",
                              str(lab.pki / "gateway" / "ca.crt"), lab.bench_token),
                 "client -> gateway (TLS, bearer, TokenReview cached, --authorize none) -> "
                 f"tunnel (mTLS 1.3) -> agent -> upstream (TLS); log level {log_level}"
                 + (f"; --workers {workers}, one agent holding a session to each"
                    if workers > 1 else ""),
                 {"gateway": [gateway.pid], "agent": [agent.pid]}, [hub, gateway, agent],
                 extra=name != "hubproxy" if extra is None else extra)
    if workers > 1:
        agent.wait_for_line(f"dialling session {workers}", 30)
    # Every worker must have its session before measuring: a few requests on fresh connections.
    for _ in range(4 * workers):
        _wait_ok(cfg)
    cfg.roles["gateway"] = tree(gateway.pid)  # the parent and its workers
    return cfg


def start_relay(lab: Lab) -> Config:
    """bench.relayhub (TCP -> tunnel stream) + ``hubproxy agent --allow-tcp`` -> upstream."""
    front, tunnel = free_port(), free_port()
    hub = lab.procs.start("relayhub", [
        sys.executable, "-m", "bench.relayhub", "--listen", f"{LOOPBACK}:{front}",
        "--tunnel-listen", f"{LOOPBACK}:{tunnel}", "--pki", str(lab.pki),
        "--cluster", RELAY_CLUSTER, "--target", f"{LOOPBACK}:{lab.upstream_port}"])
    wait_for_port(tunnel)
    agent = lab.procs.start("relay-agent", _hubproxy(
        "agent", "--hub", f"{LOOPBACK}:{tunnel}", "--cluster", RELAY_CLUSTER,
        "--tls-dir", str(lab.pki / "agents" / RELAY_CLUSTER),
        "--kubeconfig", str(lab.upstream_kubeconfig()), "--health-listen", "off",
        "--allow-tcp", f"{LOOPBACK}:{lab.upstream_port}", "--allow-loopback-targets"))
    hub.wait_for_line("relayhub ready", 30)
    cfg = Config("relay", Target(f"https://{LOOPBACK}:{lab.upstream_port}", lab.upstream_ca),
                 "client -TLS end to end-> relay hub (TCP) -> tunnel (mTLS 1.3) -> agent "
                 "(TCPTarget) -> upstream; no HTTP in the proxies",
                 {"relayhub": [hub.pid], "agent": [agent.pid]}, [hub, agent])
    cfg.target.base = f"https://{LOOPBACK}:{front}"
    _wait_ok(cfg)
    return cfg


def tool_versions() -> dict[str, str | None]:
    def first_line(args: list[str]) -> str | None:
        try:
            out = subprocess.run(args, capture_output=True, text=True, timeout=10)
        except (OSError, subprocess.TimeoutExpired):
            return None
        text = (out.stdout or out.stderr).strip()
        return text.splitlines()[0] if text else None

    from bench.loadgen import CURL, WRK
    return {
        "nginx": nginx.version(),
        "kubectl": first_line([KUBECTL, "version", "--client"]) if KUBECTL else None,
        "wrk": first_line([WRK, "--version"]) if WRK else None,
        "curl": first_line([CURL, "--version"]) if CURL else None,
        "py_spy": first_line(["py-spy", "--version"]) if shutil.which("py-spy") else None,
    }
