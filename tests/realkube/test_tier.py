"""The binaries the tier runs: the one test that reports why the tier is skipped, if it is."""

from __future__ import annotations

import subprocess

import pytest

from tests.realkube import conftest


def test_binaries_run() -> None:
    if conftest.BINARIES is None:
        if conftest.in_ci():
            pytest.fail(f"{conftest.MISSING} (CI=true: the tier must run)", pytrace=False)
        pytest.skip(conftest.MISSING)
    apiserver = subprocess.run([str(conftest.BINARIES.kube_apiserver), "--version"],
                               capture_output=True, text=True, timeout=60)
    assert apiserver.returncode == 0 and apiserver.stdout.startswith("Kubernetes v1."), apiserver
    etcd = subprocess.run([str(conftest.BINARIES.etcd), "--version"], capture_output=True,
                          text=True, timeout=60)
    assert etcd.returncode == 0 and "etcd Version: 3." in etcd.stdout, etcd
