"""Start and stop real kube-apiservers (and the etcd under them) on 127.0.0.1 for tests.

What each apiserver gets, and why:
- RBAC authorization, so the gateway's and the agent's permissions are exactly what
  ``deploy/`` grants them;
- a static token file with one admin (``system:masters``) used only for setup;
- its own service-account issuer and signing key, so ``kubectl create token`` (TokenRequest)
  works, TokenReview validates those tokens, and a test can sign a JWT with the same key (an
  expired token cannot be requested: TokenRequest's minimum lifetime is 10 minutes);
- an audit log at Metadata level with the blocking backend (every event is on disk before the
  response), so a test can read who made each request and whom it impersonated;
- ``WatchList=false``: Debian's etcd 3.4 lacks RequestWatchProgress, which WatchList needs.

Both apiservers share one etcd under different ``--etcd-prefix`` keys: two clusters for the
price of one extra process on a 2-core machine. Every process is started through a
`ProcessGroup`, so exactly those PIDs are stopped.
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import ssl
import subprocess
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import trustme
import yaml
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import rsa

from tests.realkube.binaries import Binaries
from tests.support import LOOPBACK, BackgroundProcess, ProcessGroup, free_port, wait_for_port

KUBECTL = shutil.which("kubectl") or "kubectl"
ADMIN_USER = "realkube-admin"
# A static user with no RBAC at all, for requests that must be refused (same name in kubesim).
VIEWER = ("realkube-viewer", "viewer-uid", "viewers")
AUDIT_POLICY = {
    "apiVersion": "audit.k8s.io/v1",
    "kind": "Policy",
    # One event per request, written when the response is complete.
    "omitStages": ["RequestReceived"],
    "rules": [{"level": "Metadata"}],
}


@dataclass
class RealKube:
    """One running kube-apiserver, and what a test needs to talk to it as admin."""

    name: str
    root: Path
    port: int
    ca_file: Path
    admin_token: str
    viewer_token: str  # VIEWER's
    audit_log: Path
    issuer: str
    signing_key: Path  # PEM RSA private key: the service-account token signer
    process: BackgroundProcess

    @property
    def url(self) -> str:
        return f"https://{LOOPBACK}:{self.port}"

    @property
    def admin_kubeconfig(self) -> Path:
        return self.root / "admin.kubeconfig"

    def kubeconfig(self, path: Path, *, token: str | None = None,
                   token_file: Path | None = None) -> Path:
        """A kubeconfig for this apiserver with one credential; written 0600."""
        user: dict[str, str] = (
            {"tokenFile": str(token_file)} if token_file else {"token": token or ""})
        config = {
            "apiVersion": "v1", "kind": "Config", "current-context": self.name,
            "clusters": [{"name": self.name, "cluster": {
                "server": self.url, "certificate-authority": str(self.ca_file)}}],
            "users": [{"name": "user", "user": user}],
            "contexts": [{"name": self.name, "context": {"cluster": self.name, "user": "user"}}],
        }
        write_private(path, yaml.safe_dump(config))
        return path

    def kubectl(self, *args: str, input: str | None = None, kubeconfig: Path | None = None,
                timeout: float = 60) -> subprocess.CompletedProcess[str]:
        env = {**os.environ, "KUBECONFIG": str(kubeconfig or self.admin_kubeconfig),
               "HOME": str(self.root)}
        return subprocess.run([KUBECTL, *args], env=env, input=input, capture_output=True,
                              text=True, timeout=timeout)

    def admin(self, *args: str, input: str | None = None) -> str:
        """kubectl as the admin; fails the test (with kubectl's stderr) unless it succeeds."""
        done = self.kubectl(*args, input=input)
        if done.returncode != 0:
            raise AssertionError(f"kubectl {' '.join(args)} on {self.name}: {done.stderr}")
        return done.stdout

    def apply(self, manifest: str | dict[str, Any] | list[dict[str, Any]]) -> str:
        # --validate=false: this build's OpenAPI document is malformed (see ../shared/kube).
        text = manifest if isinstance(manifest, str) else yaml.safe_dump_all(
            manifest if isinstance(manifest, list) else [manifest])
        return self.admin("apply", "--validate=false", "-f", "-", input=text)

    def create_token(self, namespace: str, account: str, *, audience: str | None = None,
                     duration: str = "2h") -> str:
        """A bound service-account token from TokenRequest (`kubectl create token`)."""
        args = ["create", "token", account, "-n", namespace, "--duration", duration]
        if audience:
            args += ["--audience", audience]
        return self.admin(*args).strip()

    def request(self, method: str, path: str, body: Any = None, token: str | None = None,
                headers: dict[str, str] | None = None) -> tuple[int, Any]:
        """One JSON request as ``token`` (default: admin); returns (status, decoded body)."""
        data = None if body is None else json.dumps(body).encode()
        req = urllib.request.Request(self.url + path, data=data, method=method, headers={
            "Authorization": f"Bearer {token or self.admin_token}",
            "Content-Type": "application/json", "Accept": "application/json",
            **(headers or {})})
        context = ssl.create_default_context(cafile=str(self.ca_file))
        try:
            with urllib.request.urlopen(req, context=context, timeout=30) as answer:
                return answer.status, json.loads(answer.read() or b"null")
        except urllib.error.HTTPError as err:
            return err.code, json.loads(err.read() or b"null")

    def audit_events(self) -> list[dict[str, Any]]:
        """Every audit event so far (the blocking backend wrote each before its response)."""
        return [json.loads(line) for line in self.audit_lines() if line.strip()]

    def audit_lines(self) -> list[str]:
        """The audit log's whole lines: the apiserver may be writing the next event as this
        reads it, and a line cut short is not an event yet."""
        text = self.audit_log.read_text() if self.audit_log.exists() else ""
        return text[:text.rfind("\n") + 1].splitlines()


def write_private(path: Path, text: str | bytes) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "wb") as out:
        out.write(text.encode() if isinstance(text, str) else text)
    return path


def start_etcd(group: ProcessGroup, binaries: Binaries, root: Path) -> str:
    """One etcd on loopback; returns its client URL once it accepts connections."""
    client, peer = free_port(), free_port()
    data = root / "etcd"
    data.mkdir(parents=True)
    group.start([
        str(binaries.etcd), "--name", "realkube", "--data-dir", str(data),
        "--listen-client-urls", f"http://{LOOPBACK}:{client}",
        "--advertise-client-urls", f"http://{LOOPBACK}:{client}",
        "--listen-peer-urls", f"http://{LOOPBACK}:{peer}",
        "--initial-advertise-peer-urls", f"http://{LOOPBACK}:{peer}",
        "--initial-cluster", f"realkube=http://{LOOPBACK}:{peer}",
        "--logger", "zap", "--log-level", "error",
    ], env={"ETCD_UNSUPPORTED_ARCH": ""})
    wait_for_port(client, timeout=20)
    return f"http://{LOOPBACK}:{client}"


def launch_apiserver(group: ProcessGroup, binaries: Binaries, name: str, root: Path,
                     etcd_url: str) -> RealKube:
    """Start one kube-apiserver (returns at once; `wait_ready` waits for it)."""
    root.mkdir(parents=True)
    ca = trustme.CA()
    serving = ca.issue_cert(LOOPBACK, "localhost")
    ca_file = root / "ca.crt"
    ca.cert_pem.write_to_path(str(ca_file))
    serving.cert_chain_pems[0].write_to_path(str(root / "tls.crt"))
    write_private(root / "tls.key", serving.private_key_pem.bytes())

    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    signing_key = write_private(root / "sa.key", key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption()))
    (root / "sa.pub").write_bytes(key.public_key().public_bytes(
        serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo))

    admin_token, viewer_token = secrets.token_urlsafe(24), secrets.token_urlsafe(24)
    write_private(root / "tokens.csv",
                  f'{admin_token},{ADMIN_USER},admin-uid,"system:masters"\n'
                  f'{viewer_token},{VIEWER[0]},{VIEWER[1]},"{VIEWER[2]}"\n')
    (root / "audit-policy.yaml").write_text(yaml.safe_dump(AUDIT_POLICY))
    port = free_port()
    issuer = f"https://{name}.realkube.invalid"
    process = group.start([
        str(binaries.kube_apiserver),
        f"--bind-address={LOOPBACK}", f"--advertise-address={LOOPBACK}",
        f"--secure-port={port}", f"--cert-dir={root / 'certs'}",
        f"--tls-cert-file={root / 'tls.crt'}", f"--tls-private-key-file={root / 'tls.key'}",
        f"--etcd-servers={etcd_url}", f"--etcd-prefix=/{name}",
        f"--token-auth-file={root / 'tokens.csv'}",
        "--authorization-mode=RBAC",
        f"--service-account-issuer={issuer}",
        f"--service-account-key-file={root / 'sa.pub'}",
        f"--service-account-signing-key-file={signing_key}",
        "--service-cluster-ip-range=10.0.0.0/24",
        f"--audit-policy-file={root / 'audit-policy.yaml'}",
        f"--audit-log-path={root / 'audit.log'}", "--audit-log-mode=blocking",
        "--audit-log-format=json",
        "--feature-gates=WatchList=false",
        # Nothing here needs these, and the machine has two cores.
        "--enable-priority-and-fairness=false", "--profiling=false",
    ])
    kube = RealKube(name, root, port, ca_file, admin_token, viewer_token, root / "audit.log",
                    issuer, signing_key, process)
    kube.kubeconfig(kube.admin_kubeconfig, token=admin_token)
    return kube


def wait_ready(kube: RealKube, timeout: float = 90.0) -> None:
    """Until /readyz says ok (RBAC bootstrap roles included); the process's log if it never does."""
    deadline = time.monotonic() + timeout
    last = ""
    while time.monotonic() < deadline:
        if kube.process.popen.poll() is not None:
            break
        try:
            status, body = _get_text(kube, "/readyz")
            if status == 200:
                return
            last = body[-500:]
        except OSError as exc:
            last = type(exc).__name__
        time.sleep(0.2)
    raise RuntimeError(f"kube-apiserver {kube.name} not ready after {timeout}s ({last}); "
                       f"log:\n{kube.process.output[-4000:]}")


def _get_text(kube: RealKube, path: str) -> tuple[int, str]:
    context = ssl.create_default_context(cafile=str(kube.ca_file))
    req = urllib.request.Request(kube.url + path,
                                 headers={"Authorization": f"Bearer {kube.admin_token}"})
    try:
        with urllib.request.urlopen(req, context=context, timeout=5) as answer:
            return answer.status, answer.read().decode()
    except urllib.error.HTTPError as err:
        return err.code, err.read().decode(errors="replace")
