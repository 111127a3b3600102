"""`python -m kubesim` as a process: flags, files, the ready line, a clean stop."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from kubesim.testing import CLUSTERPROFILE_CRD
from tests.support import ProcessGroup, free_port

RBAC = """
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRole
metadata: {name: reader}
rules:
- apiGroups: [""]
  resources: ["pods", "configmaps"]
  verbs: ["get", "list", "watch"]
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRoleBinding
metadata: {name: reader}
roleRef: {apiGroup: rbac.authorization.k8s.io, kind: ClusterRole, name: reader}
subjects:
- {apiGroup: rbac.authorization.k8s.io, kind: Group, name: readers}
"""


@pytest.mark.skipif(shutil.which("kubectl") is None, reason="kubectl not installed")
def test_cli_serves_with_token_file_rbac_file_and_crd(
    tmp_path: Path, processes: ProcessGroup
) -> None:
    (tmp_path / "tokens.csv").write_text(
        'admin-t,admin,1,"system:masters"\nreader-t,rita,2,"readers"\n'
    )
    (tmp_path / "rbac.yaml").write_text(RBAC)
    port = free_port()
    proc = processes.start(
        [
            sys.executable,
            "-m",
            "kubesim",
            "--listen",
            f"127.0.0.1:{port}",
            "--cert-dir",
            str(tmp_path / "certs"),
            "--token-auth-file",
            str(tmp_path / "tokens.csv"),
            "--rbac-file",
            str(tmp_path / "rbac.yaml"),
            "--crd",
            str(CLUSTERPROFILE_CRD),
            "--name",
            "cluster1",
        ]
    )
    assert proc.wait_for_line("kubesim ready on", timeout=20).endswith(f"https://127.0.0.1:{port}")

    def kubectl(token: str, *args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [
                "kubectl",
                f"--server=https://127.0.0.1:{port}",
                f"--token={token}",
                f"--certificate-authority={tmp_path / 'certs' / 'ca.crt'}",
                *args,
            ],
            capture_output=True,
            text=True,
            timeout=20,
            env={**os.environ, "HOME": str(tmp_path)},
        )

    version = json.loads(kubectl("admin-t", "version", "-o", "json").stdout)
    assert version["serverVersion"]["gitVersion"] == "v1.32.0+kubesim-cluster1"
    assert kubectl("reader-t", "get", "pods").returncode == 0
    assert kubectl("reader-t", "get", "secrets").returncode == 1
    assert kubectl("admin-t", "get", "clusterprofiles").returncode == 0


def test_cli_needs_certificates(tmp_path: Path) -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "kubesim", "--listen", "127.0.0.1:0"],
        capture_output=True,
        text=True,
        timeout=20,
    )
    assert proc.returncode == 2 and "--cert-dir" in proc.stderr
