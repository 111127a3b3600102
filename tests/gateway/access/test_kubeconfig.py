"""`hubproxy kubeconfig`: YAML that the real kubectl accepts, pointing at URL/<cluster>."""

from __future__ import annotations

import base64
import json
import shutil
import stat
import subprocess
from pathlib import Path

import pytest
import yaml

from certs import layout
from gateway.access.kubeconfig import build_kubeconfig
from gateway.cli import main

KUBECTL = shutil.which("kubectl")
SERVER = "https://127.0.0.1:9092"


@pytest.fixture(scope="module")
def ca_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("pki")
    layout.init(root, layout.InitOptions())
    return root / "front-ca/ca.crt"


def render(capsys: pytest.CaptureFixture, *args: str) -> dict:
    assert main(["kubeconfig", *args]) == 0
    return yaml.safe_load(capsys.readouterr().out)


def kubectl_view(path: Path) -> dict:
    assert KUBECTL is not None, "kubectl is required"
    result = subprocess.run(
        [KUBECTL, "config", "view", "--kubeconfig", str(path), "--raw", "-o", "json"],
        capture_output=True, text=True, timeout=60,
    )
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout)


def test_token_kubeconfig_points_at_url_slash_cluster(ca_file: Path, capsys, tmp_path) -> None:
    config = render(capsys, "--server", SERVER + "/", "--ca", str(ca_file), "--cluster", "c1",
                    "--cluster", "prod.eu-west", "--token", "hub-token-123")
    assert [c["name"] for c in config["clusters"]] == ["c1", "prod.eu-west"]
    assert [c["cluster"]["server"] for c in config["clusters"]] == [
        f"{SERVER}/c1", f"{SERVER}/prod.eu-west"
    ]
    for cluster in config["clusters"]:
        assert base64.b64decode(cluster["cluster"]["certificate-authority-data"]) == (
            ca_file.read_bytes()
        )
        assert "extensions" not in cluster["cluster"]
    assert config["contexts"] == [
        {"name": "c1", "context": {"cluster": "c1", "user": "hubproxy"}},
        {"name": "prod.eu-west", "context": {"cluster": "prod.eu-west", "user": "hubproxy"}},
    ]
    assert config["current-context"] == "c1"
    assert config["users"] == [{"name": "hubproxy", "user": {"token": "hub-token-123"}}]

    path = tmp_path / "kubeconfig"
    path.write_text(yaml.safe_dump(config))
    viewed = kubectl_view(path)
    assert viewed["current-context"] == "c1"
    assert {c["name"]: c["cluster"]["server"] for c in viewed["clusters"]} == {
        "c1": f"{SERVER}/c1", "prod.eu-west": f"{SERVER}/prod.eu-west"
    }
    assert viewed["users"][0]["user"]["token"] == "hub-token-123"


def test_exec_kubeconfig_uses_hubproxy_creds_with_cluster_extension(
    ca_file: Path, capsys, tmp_path: Path
) -> None:
    config = render(capsys, "--server", SERVER, "--ca", str(ca_file), "--cluster", "c2",
                    "--cluster", "c1", "--exec")
    assert config["current-context"] == "c2"
    assert config["users"] == [{
        "name": "hubproxy",
        "user": {"exec": {
            "apiVersion": "client.authentication.k8s.io/v1",
            "command": "hubproxy-creds",
            "args": [],
            "provideClusterInfo": True,
            "interactiveMode": "Never",
        }},
    }]
    for cluster in config["clusters"]:
        assert cluster["cluster"]["extensions"] == [{
            "name": "client.authentication.k8s.io/exec",
            "extension": {"clusterName": cluster["name"]},
        }]

    # kubectl may run the exec plugin while viewing; point it at a harmless stand-in.
    out = tmp_path / "kubeconfig"
    assert main(["kubeconfig", "--server", SERVER, "--ca", str(ca_file), "--cluster", "c2",
                 "--cluster", "c1", "--exec", "--exec-command", "/bin/false",
                 "--output", str(out)]) == 0
    assert stat.S_IMODE(out.stat().st_mode) == 0o600
    viewed = kubectl_view(out)
    exec_config = viewed["users"][0]["user"]["exec"]
    assert exec_config["provideClusterInfo"] is True
    assert exec_config["interactiveMode"] == "Never"
    extensions = {c["name"]: c["cluster"]["extensions"] for c in viewed["clusters"]}
    assert extensions["c1"][0]["name"] == "client.authentication.k8s.io/exec"
    assert extensions["c1"][0]["extension"] == {"clusterName": "c1"}


def test_token_file_is_referenced_not_embedded(ca_file: Path, capsys, tmp_path: Path) -> None:
    token = tmp_path / "token"
    token.write_text("secret-token\n")
    config = render(capsys, "--server", SERVER, "--ca", str(ca_file), "--cluster", "c1",
                    "--token-file", str(token))
    assert config["users"][0]["user"] == {"tokenFile": str(token)}
    assert "secret-token" not in yaml.safe_dump(config)
    path = tmp_path / "kubeconfig"
    path.write_text(yaml.safe_dump(config))
    assert kubectl_view(path)["users"][0]["user"]["tokenFile"] == str(token)


def test_exactly_one_credential_is_required(ca_file: Path, capsys) -> None:
    with pytest.raises(SystemExit) as exc:
        main(["kubeconfig", "--server", SERVER, "--ca", str(ca_file), "--cluster", "c1"])
    assert exc.value.code == 2
    with pytest.raises(SystemExit):
        main(["kubeconfig", "--server", SERVER, "--ca", str(ca_file), "--cluster", "c1",
              "--token", "t", "--exec"])
    with pytest.raises(ValueError, match="exactly one"):
        build_kubeconfig(SERVER, b"", ["c1"])


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--server", SERVER, "--cluster", "Bad_Name", "--token", "t"], "cluster name"),
        (["--server", "http://127.0.0.1:9092", "--cluster", "c1", "--token", "t"], "https://"),
        (["--server", SERVER, "--token", "t"], "at least one --cluster"),
    ],
)
def test_bad_input_is_a_clear_error(ca_file: Path, capsys, args: list[str], message: str) -> None:
    assert main(["kubeconfig", "--ca", str(ca_file), *args]) == 1
    captured = capsys.readouterr()
    assert message in captured.err
    assert captured.out == ""


def test_ca_must_be_a_certificate(tmp_path: Path, capsys) -> None:
    bogus = tmp_path / "ca.crt"
    bogus.write_text("nope")
    assert main(["kubeconfig", "--server", SERVER, "--ca", str(bogus), "--cluster", "c1",
                 "--token", "t"]) == 1
    assert "no PEM certificate" in capsys.readouterr().err


async def test_kubectl_reaches_url_slash_cluster_with_the_embedded_ca(tmp_path: Path) -> None:
    """Real kubectl (Go TLS) trusts the embedded front CA and requests <URL>/<cluster>/<path>."""
    import asyncio

    from certs.tls import server_context

    layout.init(tmp_path / "pki", layout.InitOptions())
    gw = tmp_path / "pki/gateway"
    seen: list[tuple[bytes, bytes]] = []

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 10)
        lines = head.split(b"\r\n")
        auth = next((v for k, _, v in (ln.partition(b": ") for ln in lines[1:])
                     if k.lower() == b"authorization"), b"")
        seen.append((lines[0], auth))
        body = b'{"major":"1","minor":"32","gitVersion":"v1.32.0"}'
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: "
                     + str(len(body)).encode() + b"\r\nConnection: close\r\n\r\n" + body)
        await writer.drain()
        writer.close()

    server = await asyncio.start_server(
        handle, "127.0.0.1", 0, ssl=server_context(gw / "tls.crt", gw / "tls.key", None)
    )
    port = server.sockets[0].getsockname()[1]
    try:
        out = tmp_path / "kubeconfig"
        assert main(["kubeconfig", "--server", f"https://127.0.0.1:{port}", "--ca",
                     str(gw / "ca.crt"), "--cluster", "c1", "--cluster", "c2", "--token",
                     "tok-1", "--output", str(out)]) == 0
        proc = await asyncio.create_subprocess_exec(
            KUBECTL or "kubectl", "--kubeconfig", str(out), "--context", "c2", "version", "-o",
            "json", stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
        )
        stdout, stderr = await asyncio.wait_for(proc.communicate(), 60)
        assert proc.returncode == 0, stderr.decode()
        assert b"v1.32.0" in stdout
        # (Not `get --raw`: kubectl sends raw paths as absolute, dropping the /<cluster> prefix.)
        assert seen, "kubectl reached the server"
        for request_line, auth in seen:
            assert request_line.startswith(b"GET /c2/version"), request_line
            assert auth == b"Bearer tok-1"
    finally:
        server.close()
        await server.wait_closed()
