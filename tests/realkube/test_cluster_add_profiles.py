"""`hubproxy cluster add --profile legacy|read-only` on the real kube-apiservers (issue 24).

`cluster add` reads the agent's ClusterRole on the managed cluster first, through a kubeconfig
context as `kubectl --context NAME apply` would, and never prints manifests that would silently
replace another profile's rules: it refuses (exit 1, no manifests, no token made, no record on
the hub) unless `--force`. The fleet's managed cluster runs deploy/agent (legacy); the hub's
apiserver stands in for a managed cluster with no agent yet, then with the read-only profile
and with hand-edited rules. The read-only manifests are accepted by the real apiserver
(server-side dry run: the constrained-impersonation verbs are valid RBAC).
"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from typing import Any

import pytest
import yaml

from tests.realkube.apiserver import RealKube
from tests.realkube.binaries import REPO
from tests.realkube.conftest import CLUSTER, Fleet

ROLE = "hubproxy-agent-impersonator"


def cluster_add(fleet: Fleet, name: str, managed: RealKube, *extra: str,
                context: str | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "gateway.cli", "cluster", "--kubeconfig",
         str(fleet.hub.admin_kubeconfig), "--namespace", "hubproxy", "add", name,
         "--hub", "127.0.0.1:8091", "--hub-ca", str(fleet.pki / "tunnel-ca" / "ca.crt"),
         "--managed-kubeconfig", str(managed.admin_kubeconfig),
         "--managed-context", context or managed.name, *extra],
        capture_output=True, text=True, timeout=60)


def role_of(manifests: str) -> dict[str, Any]:
    (role,) = [d for d in yaml.safe_load_all(manifests) if d and d["kind"] == "ClusterRole"]
    return dict(role)


def has_record(fleet: Fleet, name: str) -> bool:
    code, _ = fleet.hub.request("GET", f"/api/v1/namespaces/hubproxy/secrets/"
                                       f"hubproxy-cluster-{name}")
    return code == 200


@pytest.fixture
def records(fleet: Fleet) -> Iterator[list[str]]:
    """Clusters a test added: their records are deleted afterwards."""
    names: list[str] = []
    yield names
    for name in names:
        fleet.hub.admin("delete", "secret", "-n", "hubproxy", f"hubproxy-cluster-{name}",
                        "--ignore-not-found")


def read_only_rules() -> list[dict[str, Any]]:
    """deploy/agent/profiles/read-only's rules, as written there."""
    path = REPO / "deploy" / "agent" / "profiles" / "read-only" / "rbac.yaml"
    return list(yaml.safe_load(path.read_text())["rules"])


def test_the_default_is_deploy_agents_profile(fleet: Fleet, records: list[str]) -> None:
    done = cluster_add(fleet, "profile-default", fleet.managed)
    records.append("profile-default")
    assert done.returncode == 0, done.stderr
    on_cluster = yaml.safe_load(fleet.managed.admin("get", "clusterrole", ROLE, "-o", "yaml"))
    assert role_of(done.stdout)["rules"] == on_cluster["rules"]  # legacy, as deploy/agent


def test_read_only_over_legacy_is_refused_without_force(fleet: Fleet,
                                                        records: list[str]) -> None:
    refused = cluster_add(fleet, "profile-refused", fleet.managed, "--profile", "read-only")
    print(f"\nrefused (exit {refused.returncode}): {refused.stderr.strip()}")
    assert refused.returncode == 1
    assert refused.stdout == ""  # no manifests, so no token printed
    assert (f"cluster profile-refused has the legacy agent profile in ClusterRole {ROLE}; the "
            "read-only manifests would replace it: give --profile legacy to keep it, or --force "
            "to replace it") in refused.stderr
    assert not has_record(fleet, "profile-refused")  # no token was made

    forced = cluster_add(fleet, "profile-forced", fleet.managed, "--profile", "read-only",
                         "--force")
    records.append("profile-forced")
    assert forced.returncode == 0, forced.stderr
    assert "replace it with the read-only profile (--force)" in forced.stderr
    role = role_of(forced.stdout)
    assert role["rules"] == read_only_rules()
    # The real apiserver takes the read-only ClusterRole as it is (a server-side dry run: the
    # fleet's agent keeps its legacy rules).
    accepted = fleet.managed.kubectl("apply", "--dry-run=server", "--validate=false", "-f", "-",
                                     input=yaml.safe_dump(role))
    assert accepted.returncode == 0, accepted.stderr
    on_cluster = yaml.safe_load(fleet.managed.admin("get", "clusterrole", ROLE, "-o", "yaml"))
    assert on_cluster["rules"] != read_only_rules()


def test_a_read_only_cluster_is_not_made_legacy(fleet: Fleet, records: list[str]) -> None:
    hub = fleet.hub  # as a managed cluster: no agent ClusterRole on it
    assert hub.kubectl("get", "clusterrole", ROLE).returncode != 0
    fresh = cluster_add(fleet, "profile-fresh", hub)
    records.append("profile-fresh")
    assert fresh.returncode == 0, fresh.stderr  # nothing to replace
    role = {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole",
            "metadata": {"name": ROLE}, "rules": read_only_rules()}
    hub.apply(role)
    try:
        refused = cluster_add(fleet, "profile-keep", hub)
        print(f"\nrefused (exit {refused.returncode}): {refused.stderr.strip()}")
        assert refused.returncode == 1 and refused.stdout == ""
        assert "has the read-only agent profile" in refused.stderr
        assert "give --profile read-only to keep it, or --force" in refused.stderr
        assert not has_record(fleet, "profile-keep")
        same = cluster_add(fleet, "profile-keep", hub, "--profile", "read-only")
        records.append("profile-keep")
        assert same.returncode == 0, same.stderr
        # Rules edited by hand are no profile: refused whichever is asked for.
        hub.apply({**role, "rules": [*read_only_rules(), {
            "apiGroups": [""], "resources": ["pods/exec"],
            "verbs": ["impersonate-on:user-info:create"]}]})
        for profile in ("legacy", "read-only"):
            edited = cluster_add(fleet, "profile-edited", hub, "--profile", profile)
            assert edited.returncode == 1
            assert "rules of no hubproxy profile (edited by hand?)" in edited.stderr
            assert "--force to replace it" in edited.stderr
    finally:
        hub.admin("delete", "clusterrole", ROLE, "--ignore-not-found")


def test_no_way_to_check_is_a_refusal_too(fleet: Fleet, records: list[str]) -> None:
    refused = cluster_add(fleet, "profile-nocontext", fleet.managed, context="nowhere")
    print(f"\nrefused (exit {refused.returncode}): {refused.stderr.strip()}")
    assert refused.returncode == 1 and refused.stdout == ""
    assert "cannot check which agent profile cluster profile-nocontext has: no context " \
        "'nowhere' in" in refused.stderr
    assert "give --managed-context or --managed-kubeconfig, or --force" in refused.stderr
    # A context whose user may not read ClusterRoles (the viewer has no RBAC at all).
    viewer = fleet.managed.kubeconfig(fleet.root / "viewer.kubeconfig",
                                      token=fleet.managed.viewer_token)
    done = subprocess.run(
        [sys.executable, "-m", "gateway.cli", "cluster", "--kubeconfig",
         str(fleet.hub.admin_kubeconfig), "--namespace", "hubproxy", "add", "profile-viewer",
         "--hub", "127.0.0.1:8091", "--hub-ca", str(fleet.pki / "tunnel-ca" / "ca.crt"),
         "--managed-kubeconfig", str(viewer), "--managed-context", CLUSTER],
        capture_output=True, text=True, timeout=60)
    assert done.returncode == 1
    assert f"reading ClusterRole {ROLE} through context '{CLUSTER}' failed (HTTP 403)" in \
        done.stderr
    assert fleet.managed.viewer_token not in done.stderr + done.stdout
    forced = cluster_add(fleet, "profile-unchecked", fleet.managed, "--force",
                         context="nowhere")
    records.append("profile-unchecked")
    assert forced.returncode == 0, forced.stderr
    assert "not checking the agent's profile on profile-unchecked" in forced.stderr
