"""Clusters join with one command on each side; no private key travels (issue 12 item 2).

On the real hub and managed kube-apiservers, with deploy/hub's RBAC for the gateway (it reads
the CA Secret and the records in its namespace) and the Role the printed manifests give the
agent (get/update of its one credentials Secret):

* ``hubproxy cluster add`` -> ``kubectl apply -f -`` on the managed cluster -> the agent makes
  its key, joins with the token, stores key+certificate in its Secret (token gone), dials, and
  ``kubectl get`` works through the gateway;
* the certificate names the token's cluster whatever the CSR asks; a token is refused when
  used again, expired or forged;
* certificates of a few seconds are renewed under steady traffic with no failed request;
* ``cluster list`` shows states and expiries; ``cluster remove`` closes the session within
  seconds and the agent's later dials are refused.

The join door is spoken to directly with a real TLS client (``tunnel.join.request``) for the
refusal cases, so each is one request and one answer.
"""

from __future__ import annotations

import asyncio
import base64
import json
import ssl
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization

from certs.issue import new_key
from certs.sign import agent_csr
from tests.realkube.binaries import REPO
from tests.realkube.conftest import TIMINGS, Fleet
from tests.realkube.hubproxy import Gateway
from tests.support import LOOPBACK, BackgroundProcess, ProcessGroup, free_port, wait_for_port
from tunnel.identity import cluster_from_certificate
from tunnel.join import JOIN_ALPN, request

CLUSTER = "joined1"
LIFETIME = 12  # seconds: renewal at ~8 s, so a test of 30 s sees several
CREDENTIALS = ("hubproxy-agent", "hubproxy-agent-credentials")


@dataclass
class Join:
    fleet: Fleet
    group: ProcessGroup
    gateway: Gateway
    tunnel_port: int
    agent: BackgroundProcess
    tls_dir: Path
    add_seconds: float  # cluster add + kubectl apply
    ready_seconds: float  # from cluster add to the first kubectl get through the gateway
    token: str
    kubeconfig: Path  # alice's, through this gateway


def cluster_cmd(fleet: Fleet, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    done = subprocess.run(
        [sys.executable, "-m", "gateway.cli", "cluster", "--kubeconfig",
         str(fleet.hub.admin_kubeconfig), "--namespace", "hubproxy", *args],
        capture_output=True, text=True, timeout=60)
    if check:
        assert done.returncode == 0, done.stderr
    return done


def add_cluster(fleet: Fleet, name: str, port: int, *extra: str) -> tuple[str, str]:
    """(manifests, token) printed by `cluster add`."""
    # The managed cluster is where the agent's profile is checked (deploy/agent's: legacy).
    out = cluster_cmd(fleet, "add", name, "--hub", f"{LOOPBACK}:{port}", "--managed-kubeconfig",
                      str(fleet.managed.admin_kubeconfig), "--managed-context", "cluster1",
                      *extra).stdout
    secret = next(d for d in _docs(out) if d["kind"] == "Secret")
    return out, secret["stringData"]["join-token"]


def _docs(text: str) -> list[dict[str, Any]]:
    import yaml

    return [d for d in yaml.safe_load_all(text) if d]


def managed_secret(fleet: Fleet) -> dict[str, bytes]:
    code, secret = fleet.managed.request(
        "GET", f"/api/v1/namespaces/{CREDENTIALS[0]}/secrets/{CREDENTIALS[1]}")
    assert code == 200, secret
    return {k: base64.b64decode(v) for k, v in (secret.get("data") or {}).items()}


def record(fleet: Fleet, name: str) -> dict[str, str]:
    code, secret = fleet.hub.request(
        "GET", f"/api/v1/namespaces/hubproxy/secrets/hubproxy-cluster-{name}")
    assert code == 200, secret
    return {k: base64.b64decode(v).decode() for k, v in secret["data"].items()}


def ask(join: Join, body: dict[str, str], path: str = "/v1/join") -> tuple[int, dict[str, Any]]:
    """One request to the gateway's join door without a client certificate."""
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    context.minimum_version = ssl.TLSVersion.TLSv1_3
    context.load_verify_locations(cafile=str(join.fleet.pki / "tunnel-ca" / "ca.crt"))
    context.set_alpn_protocols([JOIN_ALPN])
    answer = asyncio.run(request(LOOPBACK, join.tunnel_port, context, path,
                                 json.dumps(body).encode()))
    return answer.status, json.loads(answer.body)


def csr_pem(name: str) -> str:
    return agent_csr(new_key(), name).decode()


@pytest.fixture(scope="module")
def join(fleet: Fleet, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Join]:
    root = tmp_path_factory.mktemp("join")
    pki, hub, managed = fleet.pki, fleet.hub, fleet.managed
    # deploy/join's Role (the base gives the gateway no Secrets; test_hub_rbac checks that,
    # so the Role is removed again at the end).
    hub.admin("apply", "--validate=false", "-f", str(REPO / "deploy" / "join" / "rbac.yaml"))
    hub.admin("create", "secret", "tls", "hubproxy-tunnel-ca", "-n", "hubproxy",
              "--cert", str(pki / "tunnel-ca" / "ca.crt"),
              "--key", str(pki / "tunnel-ca" / "ca.key"))
    group = ProcessGroup()
    front, tunnel = free_port(), free_port()
    process = group.hubproxy(
        "gateway", "--listen", f"{LOOPBACK}:{front}", "--tunnel-listen", f"{LOOPBACK}:{tunnel}",
        "--health-listen", "off", "--tls-dir", str(pki / "gateway"),
        "--tunnel-tls-dir", str(pki / "tunnel-server"),
        "--agent-ca", str(pki / "tunnel-ca" / "ca.crt"),
        "--hub-kubeconfig", str(fleet.gateway_kubeconfig), "--authorize", "none",
        "--join-ca-secret", "hubproxy-tunnel-ca", "--join-namespace", "hubproxy",
        "--join-certificate-lifetime", f"{LIFETIME}s", "--join-poll-interval", "1s")
    gateway = Gateway(pki, front, process)
    wait_for_port(front, timeout=30)
    wait_for_port(tunnel, timeout=30)
    try:
        # The one command on each side, timed from `cluster add` to the first kubectl get.
        started = time.monotonic()
        manifests, token = add_cluster(fleet, CLUSTER, tunnel)
        managed.admin("delete", "secret", "-n", CREDENTIALS[0], CREDENTIALS[1],
                      "--ignore-not-found")
        managed.apply(manifests)
        add_seconds = time.monotonic() - started
        # What the Deployment would run, as a process with the agent ServiceAccount's token.
        tls_dir = root / "agent-tls"
        agent = group.hubproxy(
            "agent", "--hub", f"{LOOPBACK}:{tunnel}", "--cluster", CLUSTER,
            "--tls-dir", str(tls_dir), "--credentials-secret", "/".join(CREDENTIALS),
            "--kubeconfig", str(fleet.agent_kubeconfig), "--health-listen", "off",
            "--drain-timeout", "2")
        kubeconfig = gateway.kubeconfig(root / "alice" / "kubeconfig", fleet.alice)
        kubeconfig = _retarget(kubeconfig, CLUSTER)
        deadline = time.monotonic() + 45
        while gateway.curl(f"/{CLUSTER}/version", fleet.alice)[0] != 200:
            assert time.monotonic() < deadline, (process.output[-3000:], agent.output[-3000:])
            time.sleep(0.1)
        done = gateway.kubectl(kubeconfig, "get", "configmaps", "-n", "team", timeout=20)
        assert done.returncode == 0, done.stderr
        ready_seconds = time.monotonic() - started
        TIMINGS["join: cluster add + apply"] = add_seconds
        TIMINGS["join: cluster add to first kubectl get"] = ready_seconds
        yield Join(fleet, group, gateway, tunnel, agent, tls_dir, add_seconds, ready_seconds,
                   token, kubeconfig)
    finally:
        group.stop_all()
        hub.admin("delete", "-f", str(REPO / "deploy" / "join" / "rbac.yaml"),
                  "--ignore-not-found")
        hub.admin("delete", "secret", "-n", "hubproxy", "hubproxy-tunnel-ca",
                  "--ignore-not-found")


def _retarget(kubeconfig: Path, cluster: str) -> Path:
    """The fixture's kubeconfig names cluster1 in its server URL; point it at ``cluster``."""
    text = kubeconfig.read_text().replace("/cluster1", f"/{cluster}")
    kubeconfig.write_text(text)
    return kubeconfig


def test_join_with_one_command_on_each_side(join: Join) -> None:
    fleet = join.fleet
    stored = managed_secret(fleet)
    # The token is burnt on both sides: gone from the agent's Secret, only a hash was ever on
    # the hub and that is gone too.
    assert "join-token" not in stored
    assert {"tls.key", "tls.crt", "ca.crt"} <= set(stored)
    rec = record(fleet, CLUSTER)
    assert rec["state"] == "joined" and rec["tokenHash"] == ""
    cert = x509.load_pem_x509_certificate(stored["tls.crt"])
    assert cluster_from_certificate(cert.public_bytes(serialization.Encoding.DER)) == CLUSTER
    # The key in the Secret is the agent's own: it matches the certificate the hub signed.
    key = serialization.load_pem_private_key(stored["tls.key"], None)
    assert key.public_key().public_bytes(
        serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo) == \
        cert.public_key().public_bytes(
            serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo)
    join.gateway.process.wait_for_line('"event":"cluster_join"', timeout=5)
    logs = join.gateway.process.output + join.agent.output
    assert join.token not in logs
    assert join.token.rsplit(":", 1)[1] not in logs
    assert join.ready_seconds < 30


def test_join_token_reuse_expiry_and_forgery_refused(join: Join) -> None:
    fleet = join.fleet
    # Reuse: the token the agent used.
    code, body = ask(join, {"token": join.token, "csr": csr_pem(CLUSTER)})
    assert code == 403 and "not valid" in body["error"]
    # Expiry: a fresh token that lived one second.
    _, short = add_cluster(fleet, "expiring1", join.tunnel_port, "--ttl", "1s")
    time.sleep(2.1)
    code, body = ask(join, {"token": short, "csr": csr_pem("expiring1")})
    assert code == 403
    assert record(fleet, "expiring1")["state"] == "pending"
    # Forgery: the right shape and a pending cluster, a made-up secret; and a cluster with no
    # record at all.
    _, real = add_cluster(fleet, "forged1", join.tunnel_port)
    forged = real.rsplit(":", 1)[0] + ":" + "A" * 43
    code, _ = ask(join, {"token": forged, "csr": csr_pem("forged1")})
    assert code == 403
    code, _ = ask(join, {"token": "hpjoin1:nosuch:" + "B" * 43, "csr": csr_pem("nosuch")})
    assert code == 403
    code, _ = ask(join, {"token": "not-a-token", "csr": csr_pem("forged1")})
    assert code == 403
    # The refusals did not burn the real token: it still joins, once.
    code, body = ask(join, {"token": real, "csr": csr_pem("forged1")})
    assert code == 200, body
    code, _ = ask(join, {"token": real, "csr": csr_pem("forged1")})
    assert code == 403
    out = join.gateway.process.output
    for reason in ("the join token was already used", "the join token has expired",
                   "the join token does not match", "no such cluster record"):
        assert reason in out
    assert forged not in out and short not in out and real not in out


def test_name_in_the_csr_is_ignored(join: Join) -> None:
    _, token = add_cluster(join.fleet, "bound1", join.tunnel_port)
    # The CSR asks for another cluster, in its subject and as a URI SAN.
    key = new_key()
    csr = (x509.CertificateSigningRequestBuilder()
           .subject_name(x509.Name([x509.NameAttribute(x509.NameOID.COMMON_NAME, CLUSTER)]))
           .add_extension(x509.SubjectAlternativeName(
               [x509.UniformResourceIdentifier(f"hubproxy://cluster/{CLUSTER}")]), critical=False)
           .sign(key, hashes.SHA256()))
    code, body = ask(join, {"token": token, "csr": csr.public_bytes(
        serialization.Encoding.PEM).decode()})
    assert code == 200, body
    cert = x509.load_pem_x509_certificate(body["certificate"].encode())
    assert cluster_from_certificate(cert.public_bytes(serialization.Encoding.DER)) == "bound1"
    assert cert.subject.rfc4514_string() == "CN=bound1"
    uris = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert uris.get_values_for_type(x509.UniformResourceIdentifier) == [
        "hubproxy://cluster/bound1"]


def test_renewal_without_a_token_needs_a_valid_certificate(join: Join) -> None:
    code, body = ask(join, {"csr": csr_pem(CLUSTER)}, path="/v1/renew")
    assert code == 403 and "current client certificate" in body["error"]


def test_renewal_under_steady_traffic_fails_no_request(join: Join) -> None:
    """Certificates of 12 s, renewed at ~8 s over and over while requests flow: none fails."""
    fleet, gateway = join.fleet, join.gateway
    url = f"/{CLUSTER}/api/v1/namespaces/team/configmaps"
    renewals_before = gateway.process.output.count('"event":"cluster_renew"')
    serials = set()
    failures: list[tuple[int, str]] = []
    sent = 0
    deadline = time.monotonic() + 30  # bounded in time ...
    while time.monotonic() < deadline and sent < 3000:  # ... and in count
        code, body = gateway.curl(url, fleet.alice)
        sent += 1
        if code != 200:
            failures.append((code, body[:200]))
        serials.add(x509.load_pem_x509_certificate(
            (join.tls_dir / "tls.crt").read_bytes()).serial_number)
    renewals = gateway.process.output.count('"event":"cluster_renew"') - renewals_before
    print(f"renewal under traffic: {sent} requests, {len(failures)} failed, {renewals} "
          f"renewals, {len(serials)} certificates seen")
    assert failures == [], failures
    assert renewals >= 2 and len(serials) >= 3, (renewals, len(serials))
    assert sent >= 100


def test_agent_restart_uses_its_secret_and_may_read_nothing_else(join: Join,
                                                                  tmp_path: Path) -> None:
    fleet, gateway = join.fleet, join.gateway
    joins = gateway.process.output.count('"event":"cluster_join"')
    join.agent.stop()
    # A new pod: empty tls dir, the Secret holds key and certificate, no token.
    agent = join.group.hubproxy(
        "agent", "--hub", f"{LOOPBACK}:{join.tunnel_port}", "--cluster", CLUSTER,
        "--tls-dir", str(tmp_path / "tls"), "--credentials-secret", "/".join(CREDENTIALS),
        "--kubeconfig", str(fleet.agent_kubeconfig), "--health-listen", "off",
        "--drain-timeout", "2")
    join.agent, join.tls_dir = agent, tmp_path / "tls"
    agent.wait_for_line("from the credentials Secret", timeout=30)
    deadline = time.monotonic() + 30
    while gateway.curl(f"/{CLUSTER}/version", fleet.alice)[0] != 200:
        assert time.monotonic() < deadline, agent.output[-3000:]
        time.sleep(0.1)
    assert gateway.process.output.count('"event":"cluster_join"') == joins
    # The Role of the printed manifests: get/update of that one Secret, nothing else.
    sa = f"system:serviceaccount:{CREDENTIALS[0]}:hubproxy-agent"
    for args, allowed in ((("get", f"secrets/{CREDENTIALS[1]}"), "yes"),
                          (("update", f"secrets/{CREDENTIALS[1]}"), "yes"),
                          (("get", "secrets/other"), "no"), (("list", "secrets"), "no"),
                          (("create", "secrets"), "no"), (("delete", f"secrets/{CREDENTIALS[1]}"),
                                                          "no")):
        done = fleet.managed.kubectl("auth", "can-i", *args, "-n", CREDENTIALS[0], "--as", sa)
        assert done.stdout.strip() == allowed, (args, done.stdout, done.stderr)


def test_cluster_list_shows_states_and_expiry(join: Join) -> None:
    # Its own pending record: with pytest-xdist this module's tests may be spread over both
    # workers, each with its own hub, so records another test made may not exist on this one.
    add_cluster(join.fleet, "listed1", join.tunnel_port)
    out = cluster_cmd(join.fleet, "list").stdout
    rows = {line.split()[0]: line.split() for line in out.splitlines()[1:]}
    # joined: no token left, the certificate's expiry; pending: the token's expiry, no certificate.
    assert rows[CLUSTER][1:3] == ["joined", "-"] and rows[CLUSTER][3].endswith("Z"), rows
    assert rows["listed1"][1] == "pending" and rows["listed1"][2].endswith("Z"), rows
    assert rows["listed1"][3] == "-", rows


def test_cluster_remove_closes_the_session_and_refuses_later_dials(join: Join) -> None:
    fleet, gateway = join.fleet, join.gateway
    assert gateway.curl(f"/{CLUSTER}/version", fleet.alice)[0] == 200
    started = time.monotonic()
    done = cluster_cmd(fleet, "remove", CLUSTER)
    assert '"event":"cluster_remove"' in done.stderr
    deadline = started + 15
    while gateway.curl(f"/{CLUSTER}/version", fleet.alice)[0] == 200:
        assert time.monotonic() < deadline, "the session is still up"
        time.sleep(0.05)
    closed = time.monotonic() - started
    TIMINGS["join: cluster remove to session closed"] = closed
    gateway.process.wait_for_line(f"closing the session of cluster {CLUSTER}", timeout=5)
    # The agent redials and is refused, with the reason.
    join.agent.wait_for_line("the cluster was removed", timeout=30)
    gateway.process.wait_for_line("refused (revoked)", timeout=30)
    time.sleep(2)
    assert gateway.curl(f"/{CLUSTER}/version", fleet.alice)[0] != 200
    assert closed < 8  # poll interval 1 s; the rest is load on a shared machine
    # Renewal is refused too.
    assert record(fleet, CLUSTER)["state"] == "revoked"
