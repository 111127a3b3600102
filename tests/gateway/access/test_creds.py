"""hubproxy-creds: the ExecCredential documents client-go writes, and every refusal."""

from __future__ import annotations

import base64
import json
import os
import subprocess
import sys
from datetime import UTC, datetime
from pathlib import Path

import pytest

from gateway.access.creds import (
    CredentialError,
    exec_credential,
    parse_exec_info,
    token_expiry,
)
from gateway.access.hubtokens import own_namespace, secret_token

V1BETA1 = "client.authentication.k8s.io/v1beta1"
CA_DATA = base64.b64encode(b"-----BEGIN CERTIFICATE-----\n...").decode()


def client_go_input(api_version: str, *, cluster: bool = True, config: object = None) -> str:
    """The document client-go's exec authenticator puts in KUBERNETES_EXEC_INFO."""
    spec: dict[str, object] = {"interactive": False}
    if cluster:
        entry: dict[str, object] = {
            "server": "https://127.0.0.1:9092/cluster1",
            "certificate-authority-data": CA_DATA,
        }
        if config is not None:
            entry["config"] = config
        spec["cluster"] = entry
    return json.dumps({"kind": "ExecCredential", "apiVersion": api_version, "spec": spec})


def jwt(claims: dict[str, object]) -> str:
    def part(obj: object) -> str:
        return base64.urlsafe_b64encode(json.dumps(obj).encode()).rstrip(b"=").decode()

    return f"{part({'alg': 'RS256'})}.{part(claims)}.c2lnbmF0dXJl"


@pytest.mark.parametrize(
    "api_version", ["client.authentication.k8s.io/v1", "client.authentication.k8s.io/v1beta1"]
)
def test_parses_client_go_input_with_cluster_config(api_version: str) -> None:
    request = parse_exec_info(client_go_input(api_version, config={"clusterName": "cluster1"}))
    assert request.api_version == api_version
    assert request.cluster_name == "cluster1"
    assert request.server == "https://127.0.0.1:9092/cluster1"


@pytest.mark.parametrize(
    ("document", "needle"),
    [
        (None, "KUBERNETES_EXEC_INFO is not set"),
        ("", "KUBERNETES_EXEC_INFO is not set"),
        ("{not json", "not valid JSON"),
        ("[]", "must be a JSON object"),
        (json.dumps({"kind": "Pod", "apiVersion": "v1"}), "expected ExecCredential"),
        (
            json.dumps(
                {"kind": "ExecCredential", "apiVersion": "client.authentication.k8s.io/v1alpha1"}
            ),
            "unsupported ExecCredential apiVersion",
        ),
        (client_go_input("client.authentication.k8s.io/v1", cluster=False), "provideClusterInfo"),
        (client_go_input("client.authentication.k8s.io/v1"), "clusterName is missing"),
        (client_go_input(V1BETA1, config={}), "clusterName is missing"),
        (client_go_input("client.authentication.k8s.io/v1", config="c1"), "clusterName is missing"),
        (
            client_go_input("client.authentication.k8s.io/v1", config={"clusterName": "Bad_Name"}),
            "not a valid DNS-1123 subdomain",
        ),
    ],
)
def test_refuses_bad_input(document: str | None, needle: str) -> None:
    with pytest.raises(CredentialError, match=needle):
        parse_exec_info(document)


def test_expiry_from_jwt_exp_and_none_for_opaque_tokens() -> None:
    assert token_expiry(jwt({"exp": 1900000000})) == datetime.fromtimestamp(1900000000, UTC)
    assert token_expiry("static-token") is None
    assert token_expiry(jwt({"sub": "x"})) is None
    assert token_expiry("a.!!!.c") is None
    assert token_expiry(jwt({"exp": True})) is None


def test_credential_keeps_api_version_and_formats_expiry() -> None:
    document = exec_credential(
        "client.authentication.k8s.io/v1beta1", "t0k", datetime(2030, 1, 2, 3, 4, 5, tzinfo=UTC)
    )
    assert document == {
        "apiVersion": "client.authentication.k8s.io/v1beta1",
        "kind": "ExecCredential",
        "status": {"token": "t0k", "expirationTimestamp": "2030-01-02T03:04:05Z"},
    }
    assert "expirationTimestamp" not in exec_credential("v", "t", None)["status"]  # type: ignore[operator]


def test_namespace_order(tmp_path: Path) -> None:
    ns_file = tmp_path / "namespace"
    assert own_namespace({"NAMESPACE": "env-ns"}, ns_file, "ctx-ns") == "env-ns"
    assert own_namespace({}, ns_file, "ctx-ns") == "ctx-ns"
    assert own_namespace({}, ns_file, None) == "default"
    ns_file.write_text("file-ns\n")
    assert own_namespace({}, ns_file, "ctx-ns") == "file-ns"


def test_secret_token_errors_never_show_the_token() -> None:
    assert secret_token({"token": base64.b64encode(b"abc\n").decode()}, "ns", "s") == "abc"
    for data in (None, {}, {"token": "!!notbase64"}, {"token": ""}):
        with pytest.raises(CredentialError) as info:
            secret_token(data, "ns", "c1-msa")
        assert "ns/c1-msa" in str(info.value)


def run_plugin(
    args: list[str], exec_info: str | None, tmp_path: Path
) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k != "KUBERNETES_EXEC_INFO"}
    env.pop("HUBPROXY_CREDS_ACTIVE", None)
    if exec_info is not None:
        env["KUBERNETES_EXEC_INFO"] = exec_info
    return subprocess.run(
        [sys.executable, "-m", "gateway.access.creds", *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=30,
        cwd=tmp_path,
    )


@pytest.mark.parametrize(
    "api_version", ["client.authentication.k8s.io/v1", "client.authentication.k8s.io/v1beta1"]
)
def test_plugin_prints_own_token_with_expiry(tmp_path: Path, api_version: str) -> None:
    token = jwt({"exp": 2000000000, "sub": "system:serviceaccount:apps:argocd"})
    token_file = tmp_path / "token"
    token_file.write_text(token + "\n")
    result = run_plugin(
        ["--token-file", str(token_file)],
        client_go_input(api_version, config={"clusterName": "cluster1"}),
        tmp_path,
    )
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout) == {
        "apiVersion": api_version,
        "kind": "ExecCredential",
        "status": {"token": token, "expirationTimestamp": "2033-05-18T03:33:20Z"},
    }
    assert result.stderr == ""


def test_plugin_errors_are_one_line_exit_1_and_never_leak_the_token(tmp_path: Path) -> None:
    token_file = tmp_path / "token"
    token_file.write_text("s3cr3t-token")
    no_config = client_go_input("client.authentication.k8s.io/v1")
    for exec_info in (None, "{", no_config):
        result = run_plugin(["--token-file", str(token_file)], exec_info, tmp_path)
        assert result.returncode == 1
        assert result.stdout == ""
        assert len(result.stderr.strip().splitlines()) == 1
        assert "s3cr3t-token" not in result.stderr
    missing = run_plugin(
        ["--token-file", str(tmp_path / "absent")],
        client_go_input("client.authentication.k8s.io/v1", config={"clusterName": "c1"}),
        tmp_path,
    )
    assert missing.returncode == 1
    assert "cannot read token file" in missing.stderr


def test_plugin_usage_error_exits_2(tmp_path: Path) -> None:
    result = run_plugin(["--no-such-flag"], None, tmp_path)
    assert result.returncode == 2


ROOT = Path(__file__).resolve().parents[3]


def test_default_mode_imports_no_hub_client(tmp_path: Path) -> None:
    """A credential refresh is a process start: the default mode loads only the standard
    library (no asyncio, ssl, YAML, kubernetes-asyncio or aiohttp), which is also what lets
    the static build leave the hub client out."""
    token_file = tmp_path / "token"
    token_file.write_text("t0k")
    probe = (
        "import sys\n"
        "from gateway.access.creds import main\n"
        f"code = main(['--token-file', {str(token_file)!r}])\n"
        "heavy = {'asyncio', 'ssl', 'yaml', 'kubernetes_asyncio', 'aiohttp',"
        " 'importlib.metadata'}\n"
        "print(code, sorted(m for m in sys.modules if m in heavy or m.split('.')[0] in heavy),"
        " file=sys.stderr)\n"
    )
    env = {"PYTHONPATH": str(ROOT), "KUBERNETES_EXEC_INFO": client_go_input(
        "client.authentication.k8s.io/v1", config={"clusterName": "c1"})}
    # -S: no site-packages and no .pth hooks, so only what the plugin imports is counted.
    result = subprocess.run([sys.executable, "-S", "-c", probe], env=env, capture_output=True,
                            text=True, timeout=30, cwd=tmp_path)
    assert result.stderr.strip() == "0 []", result.stderr
    assert json.loads(result.stdout)["status"]["token"] == "t0k"


def test_install_copies_only_the_static_build(tmp_path: Path) -> None:
    """--install copies the executable staticx says it started from (STATICX_PROG_PATH);
    without one (the Python package) it refuses in one line."""
    refused = run_plugin(["--install", str(tmp_path / "out")], None, tmp_path)
    assert refused.returncode == 1 and "static build" in refused.stderr
    assert not (tmp_path / "out").exists()
    executable = tmp_path / "hubproxy-plugin"
    executable.write_bytes(b"\x7fELF static")
    env = {k: v for k, v in os.environ.items() if k != "HUBPROXY_CREDS_ACTIVE"}
    env["STATICX_PROG_PATH"] = str(executable)
    target = tmp_path / "plugins" / "bin" / "hubproxy-plugin"
    done = subprocess.run([sys.executable, "-m", "gateway.access.creds", "--install", str(target)],
                          env=env, capture_output=True, text=True, timeout=30, cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert target.read_bytes() == b"\x7fELF static"
    assert target.stat().st_mode & 0o777 == 0o555
    assert [p.name for p in target.parent.iterdir()] == ["hubproxy-plugin"]  # no partial left
