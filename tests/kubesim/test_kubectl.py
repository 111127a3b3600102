"""The real kubectl against kubesim: the commands the demo, the gateway tests and users rely on.

One kubesim per module (run in a thread), one kubectl subprocess per step.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from kubesim.testing import CLUSTERPROFILE_CRD, RunningKubeSim, run_kubesim_in_thread

pytestmark = pytest.mark.skipif(shutil.which("kubectl") is None, reason="kubectl not installed")

ALICE = ("alice-token", "alice", "alice-uid", ["devs"])


@pytest.fixture(scope="module")
def sim(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningKubeSim]:
    tmp = tmp_path_factory.mktemp("kubesim")
    with run_kubesim_in_thread(tmp, users=[ALICE], crds=[CLUSTERPROFILE_CRD]) as running:
        yield running


@pytest.fixture(scope="module")
def kube(sim: RunningKubeSim, tmp_path_factory: pytest.TempPathFactory):
    tmp = tmp_path_factory.mktemp("kubectl")
    admin = sim.write_kubeconfig(tmp / "admin")
    alice = sim.write_kubeconfig(tmp / "alice", token="alice-token")

    def run(
        *args: str,
        user: str = "admin",
        stdin: str | None = None,
        check: bool = True,
        timeout: float = 20,
    ) -> subprocess.CompletedProcess[str]:
        env = {
            **os.environ,
            "KUBECONFIG": str(admin if user == "admin" else alice),
            "HOME": str(tmp),
        }
        proc = subprocess.run(
            ["kubectl", *args],
            env=env,
            input=stdin,
            capture_output=True,
            text=True,
            timeout=timeout,
        )
        if check and proc.returncode != 0:
            raise AssertionError(f"kubectl {' '.join(args)} failed: {proc.stderr}")
        return proc

    return run


def test_version_and_discovery(kube) -> None:
    out = json.loads(kube("version", "-o", "json").stdout)
    assert out["serverVersion"]["gitVersion"].startswith("v1.32.0+kubesim")
    resources = kube("api-resources", "-o", "name").stdout.split()
    for name in (
        "pods",
        "configmaps",
        "namespaces",
        "serviceaccounts",
        "secrets",
        "services",
        "roles.rbac.authorization.k8s.io",
        "clusterprofiles.multicluster.x-k8s.io",
        "customresourcedefinitions.apiextensions.k8s.io",
    ):
        assert name in resources


def test_create_get_list_delete_pod_table(kube) -> None:
    kube("run", "web", "--image=nginx:1.27", "--labels=app=web")
    table = kube("get", "pods").stdout.splitlines()
    assert table[0].split() == ["NAME", "READY", "STATUS", "RESTARTS", "AGE"]
    assert table[1].split()[:4] == ["web", "1/1", "Running", "0"]
    pod = json.loads(kube("get", "pod", "web", "-o", "json").stdout)
    assert pod["status"]["phase"] == "Running"
    assert pod["status"]["containerStatuses"][0]["ready"] is True
    assert pod["metadata"]["uid"] and pod["metadata"]["resourceVersion"]
    kube("delete", "pod", "web", "--wait=true")
    missing = kube("get", "pod", "web", check=False)
    assert missing.returncode == 1
    assert 'pods "web" not found' in missing.stderr


def test_typed_creates_use_protobuf_bodies(kube, sim: RunningKubeSim) -> None:
    kube("create", "namespace", "team-a")
    kube("create", "configmap", "settings", "-n", "team-a", "--from-literal=mode=fast")
    kube("create", "secret", "generic", "creds", "-n", "team-a", "--from-literal=password=s3cret")
    kube("create", "serviceaccount", "builder", "-n", "team-a")
    kube("create", "service", "clusterip", "api", "-n", "team-a", "--tcp=80:8080")
    cm = json.loads(kube("get", "cm", "settings", "-n", "team-a", "-o", "json").stdout)
    assert cm["data"] == {"mode": "fast"}
    assert "generation" not in cm["metadata"]
    secret = json.loads(kube("get", "secret", "creds", "-n", "team-a", "-o", "json").stdout)
    assert secret["data"] == {"password": "czNjcmV0"}
    svc = json.loads(kube("get", "svc", "api", "-n", "team-a", "-o", "json").stdout)
    assert svc["spec"]["ports"][0]["targetPort"] == 8080
    # the namespace got its default ServiceAccount, like the SA controller does
    assert "default" in kube("get", "sa", "-n", "team-a", "-o", "name").stdout
    assert any(
        r.header("Content-Type") == ["application/vnd.kubernetes.protobuf"]
        for r in sim.requests_to("/api/v1/namespaces/team-a/configmaps")
    )


def test_apply_twice_then_patch_merge_json_strategic(kube, tmp_path: Path) -> None:
    manifest = tmp_path / "cm.yaml"
    manifest.write_text(
        "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: applied\n"
        "  labels: {app: web, tier: front}\ndata:\n  k: v1\n"
    )
    assert "created" in kube("apply", "-f", str(manifest)).stdout
    manifest.write_text(manifest.read_text().replace("k: v1", "k: v2"))
    applied = kube("apply", "-f", str(manifest))
    assert "configured" in applied.stdout and "warning" not in applied.stderr.lower()
    kube("patch", "cm", "applied", "--type=merge", "-p", '{"data":{"m":"merge"}}')
    kube(
        "patch",
        "cm",
        "applied",
        "--type=json",
        "-p",
        '[{"op":"replace","path":"/data/k","value":"v3"}]',
    )
    kube("patch", "cm", "applied", "-p", '{"data":{"s":"strategic"}}')
    data = json.loads(kube("get", "cm", "applied", "-o", "jsonpath={.data}").stdout)
    assert data == {"k": "v3", "m": "merge", "s": "strategic"}
    bad = kube(
        "patch",
        "cm",
        "applied",
        "--type=json",
        "-p",
        '[{"op":"remove","path":"/data/nope"}]',
        check=False,
    )
    assert bad.returncode == 1


def test_apply_pod_merges_containers_by_name(kube, tmp_path: Path) -> None:
    manifest = tmp_path / "pod.yaml"
    manifest.write_text(
        "apiVersion: v1\nkind: Pod\nmetadata: {name: envpod}\nspec:\n  containers:\n"
        "  - name: c\n    image: busybox\n    env: [{name: A, value: '1'}]\n"
    )
    kube("apply", "-f", str(manifest))
    manifest.write_text(manifest.read_text().replace("'1'", "'2'"))
    kube("apply", "-f", str(manifest))
    env = json.loads(
        kube("get", "pod", "envpod", "-o", "jsonpath={.spec.containers[0].env}").stdout
    )
    assert env == [{"name": "A", "value": "2"}]


def test_label_selectors(kube) -> None:
    for name, labels in (
        ("s-a", "app=web,tier=front"),
        ("s-b", "app=web,tier=back"),
        ("s-c", "app=db"),
    ):
        kube("create", "cm", name)
        kube("label", "cm", name, *labels.split(","))

    def names(selector: str) -> set[str]:
        out = kube("get", "cm", "-l", selector, "-o", "name").stdout.split()
        return {n.split("/")[1] for n in out if n.split("/")[1].startswith("s-")}

    assert names("app=web") == {"s-a", "s-b"}
    assert names("app==web,tier!=back") == {"s-a"}
    assert names("tier in (front,back)") == {"s-a", "s-b"}
    assert names("app,tier notin (front)") == {"s-b", "s-c"}
    assert names("!tier,app") == {"s-c"}
    field = kube("get", "cm", "--field-selector", "metadata.name=s-c", "-o", "name").stdout.split()
    assert field == ["configmap/s-c"]


def test_watch_prints_added_modified_deleted(kube, sim: RunningKubeSim, tmp_path: Path) -> None:
    env = {
        **os.environ,
        "KUBECONFIG": str(sim.write_kubeconfig(tmp_path / "kc")),
        "HOME": str(tmp_path),
    }
    kube("create", "cm", "watched", "--from-literal=a=1")
    watch = subprocess.Popen(
        ["kubectl", "get", "cm", "watched", "-w", "-o", "json", "--request-timeout=6s"],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        deadline = time.monotonic() + 10
        while not any("watch=true" in r.path and "watched" in r.path for r in sim.received):
            assert time.monotonic() < deadline, "kubectl never started watching"
            time.sleep(0.05)
        kube("label", "cm", "watched", "step=two")
        kube("delete", "cm", "watched")
        time.sleep(0.5)
    finally:
        watch.terminate()
        out, _ = watch.communicate(timeout=10)
    decoder = json.JSONDecoder()
    objects, text = [], out.strip()
    while text:
        obj, end = decoder.raw_decode(text)
        objects.append(obj)
        text = text[end:].strip()
    assert [o["metadata"].get("labels", {}).get("step") for o in objects] == [None, "two", "two"]


def test_auth_whoami_and_can_i(kube) -> None:
    whoami = json.loads(kube("auth", "whoami", "-o", "json", user="alice").stdout)
    assert whoami["status"]["userInfo"] == {
        "username": "alice",
        "uid": "alice-uid",
        "groups": ["devs", "system:authenticated"],
    }
    assert kube("auth", "can-i", "list", "pods", user="alice", check=False).returncode == 1
    assert kube("auth", "can-i", "list", "pods").stdout.strip() == "yes"
    kube("create", "role", "pod-reader", "--verb=get,list", "--resource=pods")
    kube("create", "rolebinding", "alice-reads", "--role=pod-reader", "--group=devs")
    assert kube("auth", "can-i", "list", "pods", user="alice").stdout.strip() == "yes"
    assert kube("auth", "can-i", "delete", "pods", user="alice", check=False).stdout.strip() == "no"
    assert (
        kube(
            "auth", "can-i", "list", "pods", "-n", "kube-system", user="alice", check=False
        ).returncode
        == 1
    )
    denied = kube("get", "secrets", user="alice", check=False)
    assert denied.stderr.strip() == (
        'Error from server (Forbidden): secrets is forbidden: User "alice" cannot list resource '
        '"secrets" in API group "" in the namespace "default"'
    )


def test_create_token_authenticates_as_service_account(kube, sim: RunningKubeSim) -> None:
    kube("create", "serviceaccount", "robot")
    token = kube("create", "token", "robot", "--duration=20m").stdout.strip()
    assert token.count(".") == 2
    env_kc = sim.kubeconfig(token)
    path = Path(sim.ca_file).parent / "robot.kubeconfig"
    path.write_text(json.dumps(env_kc))
    proc = subprocess.run(
        ["kubectl", "auth", "whoami", "-o", "json"],
        capture_output=True,
        text=True,
        env={**os.environ, "KUBECONFIG": str(path)},
        timeout=20,
    )
    info = json.loads(proc.stdout)["status"]["userInfo"]
    assert info["username"] == "system:serviceaccount:default:robot"
    assert info["groups"] == [
        "system:serviceaccounts",
        "system:serviceaccounts:default",
        "system:authenticated",
    ]
    assert info["extra"]["authentication.kubernetes.io/credential-id"][0].startswith("JTI=")
    missing = kube("create", "token", "ghost", check=False)
    assert 'serviceaccounts "ghost" not found' in missing.stderr


def test_impersonation_flags(kube) -> None:
    who = json.loads(
        kube(
            "auth",
            "whoami",
            "-o",
            "json",
            "--as",
            "bob",
            "--as-group",
            "g1",
            "--as-group",
            "g2",
            "--as-uid",
            "u-7",
        ).stdout
    )["status"]["userInfo"]
    assert who == {"username": "bob", "uid": "u-7", "groups": ["g1", "g2", "system:authenticated"]}
    sa = json.loads(
        kube("auth", "whoami", "-o", "json", "--as", "system:serviceaccount:ns1:sa1").stdout
    )["status"]["userInfo"]
    assert sa["groups"] == [
        "system:serviceaccounts",
        "system:serviceaccounts:ns1",
        "system:authenticated",
    ]
    denied = kube("get", "pods", "--as", "bob", user="alice", check=False)
    assert denied.stderr.strip() == (
        'Error from server (Forbidden): pods is forbidden: User "alice" cannot '
        'impersonate-on:user-info:list resource "pods" in API group "" in the namespace "default"'
    )


def test_errors_for_unknown_resource_and_bad_token(
    kube, sim: RunningKubeSim, tmp_path: Path
) -> None:
    unknown = kube("get", "widgets", check=False)
    assert 'the server doesn\'t have a resource type "widgets"' in unknown.stderr
    raw = kube("get", "--raw", "/api/v1/namespaces/default/widgets", check=False)
    assert "the server could not find the requested resource" in raw.stderr
    bad = sim.write_kubeconfig(tmp_path / "bad", token="not-a-token")
    proc = subprocess.run(
        ["kubectl", "get", "pods"],
        capture_output=True,
        text=True,
        timeout=20,
        env={**os.environ, "KUBECONFIG": str(bad), "HOME": str(tmp_path)},
    )
    assert proc.returncode == 1
    assert "error: You must be logged in to the server" in proc.stderr


def test_clusterprofile_crd_with_kubectl(kube, tmp_path: Path) -> None:
    manifest = tmp_path / "cp.yaml"
    manifest.write_text(
        "apiVersion: multicluster.x-k8s.io/v1alpha1\nkind: ClusterProfile\nmetadata:\n"
        "  name: cluster1\n  namespace: default\nspec:\n  displayName: c1\n"
        "  clusterManager: {name: hubproxy}\n"
    )
    kube("apply", "-f", str(manifest))
    table = kube("get", "clusterprofiles").stdout.splitlines()
    assert table[0].split() == ["NAME", "AGE"] and table[1].split()[0] == "cluster1"
    kube(
        "patch",
        "clusterprofile",
        "cluster1",
        "--subresource=status",
        "--type=merge",
        "-p",
        '{"status":{"conditions":[],"accessProviders":[{"name":"hubproxy",'
        '"cluster":{"server":"https://gw:9092/cluster1"}}]}}',
    )
    status = json.loads(
        kube("get", "clusterprofile", "cluster1", "-o", "jsonpath={.status}").stdout
    )
    assert status["accessProviders"][0]["cluster"]["server"] == "https://gw:9092/cluster1"
    bad = kube(
        "patch",
        "clusterprofile",
        "cluster1",
        "--subresource=status",
        "--type=json",
        "-p",
        '[{"op":"replace","path":"/status/conditions","value":null}]',
        check=False,
    )
    assert "status.conditions in body must be of type array" in bad.stderr
