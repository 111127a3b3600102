"""The real-kube-apiserver tier: one hub and one managed kube-apiserver per test session.

`kube` starts etcd and both apiservers (in parallel); `fleet` installs hubproxy the way
``deploy/`` says (the gateway's and the agent's RBAC applied from the kustomize bases, tokens
of those ServiceAccounts from TokenRequest) and starts a gateway and an agent as processes.

Without binaries (see binaries.py) only test_tier.py is collected, and its one test is skipped
with the reason: one line that says why, not one per test. With ``CI=true`` a missing binary is
an error in every test instead, and any skip in this directory is turned into a failure: in CI
the tier must run, never pass by not running.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from tests.realkube.apiserver import (
    RealKube,
    launch_apiserver,
    start_etcd,
    wait_ready,
    write_private,
)
from tests.realkube.binaries import REPO, Binaries, MissingBinaries, find_binaries
from tests.realkube.hubproxy import CLUSTER, Gateway, init_pki, start_gateway, wait_connected
from tests.support import ProcessGroup, in_ci

HERE = Path(__file__).resolve().parent
CRDS = REPO.parent / "shared" / "crds"
GATEWAY_SA = ("hubproxy", "hubproxy-gateway")  # deploy/hub
AGENT_SA = ("hubproxy-agent", "hubproxy-agent")  # deploy/agent
PREFIX = "cluster:hub:"
TIMINGS: dict[str, float] = {}


BINARIES: Binaries | None = None
MISSING = ""
try:
    BINARIES = find_binaries()
except MissingBinaries as exc:
    MISSING = f"real kube-apiserver tier: {exc}"
    if not in_ci():
        collect_ignore = [p.name for p in HERE.glob("test_*.py") if p.name != "test_tier.py"]


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if HERE in Path(str(item.path)).parents:
            item.add_marker(pytest.mark.realkube)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Iterator[None]:
    outcome = yield
    report = outcome.get_result()
    # xfail is reported as "skipped" too; only a real skip is refused.
    if in_ci() and report.skipped and not hasattr(report, "wasxfail"):
        report.outcome = "failed"
        report.longrepr = f"realkube test skipped under CI=true, which must not happen: " \
                          f"{report.longrepr}"


def pytest_terminal_summary(terminalreporter: Any) -> None:
    if TIMINGS:
        parts = ", ".join(f"{name} {seconds:.1f}s" for name, seconds in TIMINGS.items())
        terminalreporter.write_line(f"realkube: {parts}")


@dataclass
class Kube:
    hub: RealKube
    managed: RealKube
    root: Path


@pytest.fixture(scope="session")
def kube(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Kube]:
    if BINARIES is None:
        if in_ci():
            pytest.fail(f"{MISSING} (CI=true: the tier must run)", pytrace=False)
        pytest.skip(MISSING)  # a test file named on the command line
    binaries = BINARIES
    root = tmp_path_factory.mktemp("realkube")
    group = ProcessGroup()
    started = time.monotonic()
    try:
        etcd = start_etcd(group, binaries, root)
        hub = launch_apiserver(group, binaries, "hub", root / "hub", etcd)
        managed = launch_apiserver(group, binaries, CLUSTER, root / CLUSTER, etcd)
        wait_ready(hub)
        wait_ready(managed)
        TIMINGS["etcd + 2 kube-apiservers ready in"] = time.monotonic() - started
        yield Kube(hub, managed, root)
    finally:
        group.stop_all()


@dataclass
class Fleet:
    """hubproxy installed from deploy/ on the real hub and managed cluster, and its users."""

    kube: Kube
    group: ProcessGroup
    root: Path
    pki: Path
    gateway: Gateway
    gateway_kubeconfig: Path  # hub, as ServiceAccount hubproxy/hubproxy-gateway
    agent_kubeconfig: Path  # managed, as ServiceAccount hubproxy-agent/hubproxy-agent
    alice: str  # hub token of fleet/alice, who may use CLUSTER
    bob: str  # hub token of fleet/bob, who may not
    alice_uid: str
    tokens: list[str] = field(default_factory=list)  # every secret, to check logs against

    @property
    def hub(self) -> RealKube:
        return self.kube.hub

    @property
    def managed(self) -> RealKube:
        return self.kube.managed

    def user_kubeconfig(self, name: str, token: str, gateway: Gateway | None = None) -> Path:
        return (gateway or self.gateway).kubeconfig(self.root / "users" / name, token)


def hub_users() -> list[dict[str, Any]]:
    """alice may `get managedclusters/proxy cluster1` (what --authorize=sar asks); bob may not."""
    return [
        {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "fleet"}},
        *({"apiVersion": "v1", "kind": "ServiceAccount",
           "metadata": {"name": name, "namespace": "fleet"}} for name in ("alice", "bob")),
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole",
         "metadata": {"name": f"use-{CLUSTER}"},
         "rules": [{"apiGroups": ["cluster.open-cluster-management.io"],
                    "resources": ["managedclusters/proxy"], "resourceNames": [CLUSTER],
                    "verbs": ["get"]}]},
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding",
         "metadata": {"name": f"alice-uses-{CLUSTER}"},
         "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole",
                     "name": f"use-{CLUSTER}"},
         "subjects": [{"kind": "ServiceAccount", "name": "alice", "namespace": "fleet"}]},
    ]


def managed_access() -> list[dict[str, Any]]:
    """On the managed cluster, alice's mapped identity may edit ConfigMaps in `team` only."""
    user = f"{PREFIX}system:serviceaccount:fleet:alice"
    return [
        *({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}}
          for ns in ("team", "other")),
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role",
         "metadata": {"name": "configmap-editor", "namespace": "team"},
         "rules": [{"apiGroups": [""], "resources": ["configmaps"],
                    "verbs": ["get", "list", "watch", "create", "patch", "update"]}]},
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding",
         "metadata": {"name": "alice-edits-configmaps", "namespace": "team"},
         "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role",
                     "name": "configmap-editor"},
         "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": user}]},
    ]


def apply_crds(hub: RealKube) -> None:
    """Every CRD in ../shared/crds (ClusterProfile, OCM), established before anyone uses it."""
    for path in sorted(CRDS.rglob("*.yaml")):
        hub.admin("apply", "--validate=false", "--server-side", "-f", str(path))
    hub.admin("wait", "--for=condition=Established", "crd", "--all", "--timeout=60s")


@pytest.fixture(scope="session")
def fleet(kube: Kube) -> Iterator[Fleet]:
    started = time.monotonic()
    hub, managed = kube.hub, kube.managed
    root = kube.root / "fleet"
    group = ProcessGroup()
    try:
        # Exactly deploy/'s RBAC: the whole bases are applied (their Deployments stay without
        # pods: there is no controller-manager), and the processes use those SAs' tokens.
        hub.admin("apply", "--validate=false", "-k", str(REPO / "deploy" / "hub"))
        managed.admin("apply", "--validate=false", "-k", str(REPO / "deploy" / "agent"))
        apply_crds(hub)
        hub.apply(hub_users())
        managed.apply(managed_access())
        gateway_token = hub.create_token(*GATEWAY_SA)
        agent_token = managed.create_token(*AGENT_SA)
        gateway_kubeconfig = hub.kubeconfig(root / "gateway.kubeconfig", token=gateway_token)
        agent_token_file = write_private(root / "agent.token", agent_token)
        agent_kubeconfig = managed.kubeconfig(root / "agent.kubeconfig",
                                              token_file=agent_token_file)
        alice, bob = hub.create_token("fleet", "alice"), hub.create_token("fleet", "bob")
        _, sa = hub.request("GET", "/api/v1/namespaces/fleet/serviceaccounts/alice")
        pki = init_pki(root / "pki")
        # A short cache, so a token that stops being valid is refused within a second.
        gateway = start_gateway(group, pki, gateway_kubeconfig, agent_kubeconfig,
                                "--token-cache-ttl", "1s")
        wait_connected(gateway, alice)
        TIMINGS["hubproxy installed and connected in"] = time.monotonic() - started
        yield Fleet(kube, group, root, pki, gateway, gateway_kubeconfig, agent_kubeconfig,
                    alice, bob, sa["metadata"]["uid"],
                    [gateway_token, agent_token, alice, bob, hub.admin_token,
                     managed.admin_token])
    finally:
        group.stop_all()
