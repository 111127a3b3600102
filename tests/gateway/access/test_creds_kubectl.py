"""hubproxy-creds driven by the real kubectl (client-go's exec authenticator) against kubesim."""

from __future__ import annotations

import asyncio
import base64
import json
import os
import stat
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from kubesim.testing import run_kubesim

V1 = "client.authentication.k8s.io/v1"
V1BETA1 = "client.authentication.k8s.io/v1beta1"


def exec_kubeconfig(sim: Any, path: Path, command: str, args: list[str], *, api_version: str,
                    cluster_name: str | None, provide_cluster_info: bool = True) -> Path:
    cluster: dict[str, Any] = {"server": sim.url, "certificate-authority": sim.ca_file}
    if cluster_name is not None:
        cluster["extensions"] = [{"name": "client.authentication.k8s.io/exec",
                                  "extension": {"clusterName": cluster_name}}]
    config = {
        "apiVersion": "v1", "kind": "Config", "current-context": "c",
        "clusters": [{"name": "c", "cluster": cluster}],
        "contexts": [{"name": "c", "context": {"cluster": "c", "user": "u"}}],
        "users": [{"name": "u", "user": {"exec": {
            "apiVersion": api_version, "command": command, "args": args,
            "provideClusterInfo": provide_cluster_info, "interactiveMode": "Never"}}}],
    }
    path.write_text(yaml.safe_dump(config))
    return path


def recording_plugin(tmp_path: Path) -> Path:
    """A wrapper that saves KUBERNETES_EXEC_INFO, then runs the real plugin."""
    script = tmp_path / "record-then-creds"
    script.write_text(
        "#!/bin/sh\n"
        f'printf "%s" "$KUBERNETES_EXEC_INFO" > "{tmp_path}/exec-info.json"\n'
        f'exec "{sys.executable}" -m gateway.access.creds "$@"\n'
    )
    script.chmod(script.stat().st_mode | stat.S_IXUSR)
    return script


@pytest.mark.parametrize("api_version", [V1, V1BETA1])
async def test_kubectl_uses_the_plugin_token_and_sends_cluster_info(
    tmp_path: Path, api_version: str
) -> None:
    async with run_kubesim(tmp_path) as sim:
        token = sim.mint_token("apps", "argocd")
        (tmp_path / "token").write_text(token)
        kubeconfig = exec_kubeconfig(
            sim, tmp_path / "kc", str(recording_plugin(tmp_path)),
            ["--token-file", str(tmp_path / "token")],
            api_version=api_version, cluster_name="cluster1",
        )
        rc, out, err = await sim.kubectl("auth", "whoami", "-o", "json", kubeconfig=kubeconfig)
        assert rc == 0, err
        assert json.loads(out)["status"]["userInfo"]["username"] == (
            "system:serviceaccount:apps:argocd"
        )
        sent = json.loads((tmp_path / "exec-info.json").read_text())
        assert sent["apiVersion"] == api_version
        assert sent["spec"]["cluster"]["config"] == {"clusterName": "cluster1"}
        assert sent["spec"]["cluster"]["server"] == sim.url
        assert token not in err


async def test_kubectl_reports_plugin_refusal_without_cluster_extension(tmp_path: Path) -> None:
    async with run_kubesim(tmp_path) as sim:
        (tmp_path / "token").write_text(sim.mint_token("apps", "argocd"))
        for cluster_name, provide in ((None, True), ("cluster1", False)):
            kubeconfig = exec_kubeconfig(
                sim, tmp_path / "kc", str(recording_plugin(tmp_path)),
                ["--token-file", str(tmp_path / "token")],
                api_version=V1, cluster_name=cluster_name, provide_cluster_info=provide,
            )
            rc, _, err = await sim.kubectl("get", "ns", kubeconfig=kubeconfig)
            assert rc != 0
            assert "hubproxy-creds:" in err
            assert ("clusterName is missing" in err) or ("provideClusterInfo" in err)


async def test_cluster_flag_stands_in_for_argo_cd_which_sends_no_cluster_info(
        tmp_path: Path) -> None:
    """Argo CD's execProviderConfig (command, args, apiVersion) has no provideClusterInfo:
    ``--cluster`` names the cluster instead, and kubectl (client-go, as Argo CD) then works."""
    async with run_kubesim(tmp_path) as sim:
        (tmp_path / "token").write_text(sim.mint_token("argocd", "argocd-application-controller"))
        kubeconfig = exec_kubeconfig(
            sim, tmp_path / "kc", str(recording_plugin(tmp_path)),
            ["--cluster", "cluster1", "--token-file", str(tmp_path / "token")],
            api_version=V1BETA1, cluster_name=None, provide_cluster_info=False,
        )
        rc, out, err = await sim.kubectl("auth", "whoami", kubeconfig=kubeconfig)
        assert rc == 0, err
        assert "system:serviceaccount:argocd:argocd-application-controller" in out
        sent = json.loads((tmp_path / "exec-info.json").read_text())
        assert "cluster" not in sent.get("spec", {})  # really without cluster information


async def test_managed_serviceaccount_mode_reads_the_secret(tmp_path: Path) -> None:
    """cp-creds compatibility: Secret <clusterName>-<NAME>, key token, own namespace."""
    async with run_kubesim(tmp_path) as sim:
        sim.apply({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "kueue-system"}})
        sim.apply({"apiVersion": "v1", "kind": "Secret",
                   "metadata": {"name": "cluster1-kueue", "namespace": "kueue-system"},
                   "data": {"token": base64.b64encode(b"managed-sa-token").decode()}})
        reader = sim.mint_token("kueue-system", "kueue-controller")
        sim.grant("ServiceAccount:kueue-system:kueue-controller", ["get"], ["secrets"],
                  namespace="kueue-system")
        hub_kubeconfig = sim.write_kubeconfig(tmp_path / "hub-kc", token=reader)
        exec_info = json.dumps({"kind": "ExecCredential", "apiVersion": V1, "spec": {
            "cluster": {"server": "https://gw:9092/cluster1",
                        "config": {"clusterName": "cluster1"}},
            "interactive": False}})
        env = {k: v for k, v in os.environ.items() if not k.startswith("HUBPROXY_CREDS")}
        env.update(KUBERNETES_EXEC_INFO=exec_info, NAMESPACE="kueue-system")
        async def plugin(*args: str) -> tuple[int, str, str]:
            proc = await asyncio.create_subprocess_exec(
                sys.executable, "-m", "gateway.access.creds", "--managed-serviceaccount", *args,
                "--hub-kubeconfig", str(hub_kubeconfig), env=env,
                stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
            out, err = await asyncio.wait_for(proc.communicate(), 30)
            return proc.returncode or 0, out.decode(), err.decode()

        rc, out, err = await plugin("kueue")
        assert rc == 0, err
        assert json.loads(out)["status"] == {"token": "managed-sa-token"}
        rc, out, err = await plugin("absent")
        assert (rc, out) == (1, "")
        assert "Secret kueue-system/cluster1-absent not found" in err
