"""The agent's apiserver access: in-cluster files, kubeconfig forms, refusals, token rotation."""

from __future__ import annotations

import base64
import logging
import os
from pathlib import Path

import pytest
import trustme
import yaml

from gateway.agent.kubeapi import (
    KubeAPIAccess,
    KubeAPIConfigError,
    TokenSource,
    from_kubeconfig,
    in_cluster,
    load,
)


def kubeconfig(path: Path, cluster: dict, user: dict) -> str:
    path.write_text(yaml.safe_dump({
        "apiVersion": "v1", "kind": "Config", "current-context": "c",
        "clusters": [{"name": "k", "cluster": cluster}], "users": [{"name": "u", "user": user}],
        "contexts": [{"name": "c", "context": {"cluster": "k", "user": "u"}}],
    }))
    return str(path)


@pytest.fixture
def ca_file(ca: trustme.CA, tmp_path: Path) -> str:
    path = tmp_path / "ca.crt"
    ca.cert_pem.write_to_path(str(path))
    return str(path)


def _in_cluster_with_token(tmp_path: Path, ca_file: str) -> tuple[Path, KubeAPIAccess]:
    """An in-cluster access whose service account token is ``sa-token``."""
    sa = tmp_path / "sa"
    sa.mkdir()
    (sa / "token").write_text("sa-token\n")
    (sa / "ca.crt").write_bytes(Path(ca_file).read_bytes())
    return sa, in_cluster({"KUBERNETES_SERVICE_HOST": "10.0.0.1",
                           "KUBERNETES_SERVICE_PORT": "443"}, sa)


def test_in_cluster_service_account(tmp_path: Path, ca_file: str) -> None:
    _, access = _in_cluster_with_token(tmp_path, ca_file)
    assert (access.host, access.port, access.server_hostname) == ("10.0.0.1", 443, "10.0.0.1")
    assert access.authorization() == b"Bearer sa-token"
    assert "sa-token" not in access.describe()


def test_authorization_follows_a_rotated_token(tmp_path: Path, ca_file: str) -> None:
    """The Authorization value is kept between requests (asked per request), never past a
    rotation of the token it was made of."""
    sa, access = _in_cluster_with_token(tmp_path, ca_file)
    assert access.token is not None
    access.token.check_interval = 0.0
    first = access.authorization()
    assert first == b"Bearer sa-token" and access.authorization() is first
    (sa / "new").write_text("rotated")
    os.replace(sa / "new", sa / "token")
    assert access.authorization() == b"Bearer rotated"


def test_not_in_cluster_says_what_to_do(tmp_path: Path) -> None:
    with pytest.raises(KubeAPIConfigError, match="--kubeconfig"):
        in_cluster({}, tmp_path)


def test_kubeconfig_with_embedded_ca_and_token(tmp_path: Path, ca_file: str) -> None:
    data = base64.b64encode(Path(ca_file).read_bytes()).decode()
    access = from_kubeconfig(kubeconfig(
        tmp_path / "kc", {"server": "https://api.example:6443",
                          "certificate-authority-data": data}, {"token": "tok"}))
    assert (access.host, access.port) == ("api.example", 6443)
    assert access.authorization() == b"Bearer tok"
    assert access.ssl_context().verify_mode.name == "CERT_REQUIRED"


def test_kubeconfig_client_certificate(tmp_path: Path, ca: trustme.CA, ca_file: str) -> None:
    leaf = ca.issue_cert("agent")
    cert, key = tmp_path / "c.crt", tmp_path / "c.key"
    leaf.cert_chain_pems[0].write_to_path(str(cert))
    leaf.private_key_pem.write_to_path(str(key))
    access = from_kubeconfig(kubeconfig(
        tmp_path / "kc", {"server": "https://127.0.0.1:6443", "certificate-authority": ca_file},
        {"client-certificate": str(cert), "client-key": str(key)}))
    assert access.authorization() is None
    assert "client certificate" in access.describe()


@pytest.mark.parametrize("cluster, user, message", [
    ({"server": "https://a:1", "insecure-skip-tls-verify": True}, {"token": "t"}, "insecure"),
    ({"server": "https://a:1"}, {"token": "t"}, "certificate-authority"),
    ({"server": "http://a:1", "certificate-authority": "CA"}, {"token": "t"}, "https"),
    ({"server": "https://a:1", "certificate-authority": "CA"},
     {"exec": {"command": "x"}}, "exec"),
    ({"server": "https://a:1", "certificate-authority": "CA"}, {}, "no token"),
])
def test_kubeconfig_refusals(tmp_path: Path, ca_file: str, cluster: dict, user: dict,
                             message: str) -> None:
    cluster = {k: (ca_file if v == "CA" else v) for k, v in cluster.items()}
    with pytest.raises(KubeAPIConfigError, match=message):
        from_kubeconfig(kubeconfig(tmp_path / "kc", cluster, user))


def test_token_file_rotation_and_bad_replacement_keeps_old(tmp_path: Path) -> None:
    path = tmp_path / "token"
    path.write_text("one\n")
    source = TokenSource(path=str(path), check_interval=0.0)
    assert source.current() == "one"
    (tmp_path / "new").write_text("two")
    os.replace(tmp_path / "new", path)
    assert source.current() == "two"
    path.write_text("")  # a half-written file is not a token
    assert source.current() == "two"


def test_token_file_logs_and_errors_never_carry_the_token(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG)
    secret = "s3cr3t-" + os.urandom(8).hex()
    path = tmp_path / "token"
    path.write_text(secret + "-one")
    source = TokenSource(path=str(path), check_interval=0.0)
    path.write_text(secret + "-two")  # rotated
    assert source.current() == secret + "-two"
    for bad in ((secret + "\nline2").encode(),  # not one token
                secret.encode() + b"\xff\xfe"):  # not text: the decoder would quote a byte
        path.write_bytes(bad)
        assert source.current() == secret + "-two"
    path.unlink()  # gone
    assert source.current() == secret + "-two"
    messages = [r.getMessage() for r in caplog.records]
    assert any("changed" in m for m in messages) and any("unreadable" in m for m in messages)
    errors = []
    for content in (secret.encode() + b"\xff", b"\n", (secret + "\0").encode()):
        path.write_bytes(content)
        with pytest.raises(KubeAPIConfigError) as caught:
            TokenSource(path=str(path))
        errors.append(str(caught.value))
    for text in [*messages, *errors]:
        assert secret not in text and "0xff" not in text, text


def test_flags_override_address_ca_and_token(tmp_path: Path, ca_file: str) -> None:
    token = tmp_path / "t"
    token.write_text("flag-token")
    access = load(apiserver="https://127.0.0.1:7443", apiserver_ca=ca_file,
                  token_file=str(token))
    assert (access.host, access.port) == ("127.0.0.1", 7443)
    assert access.authorization() == b"Bearer flag-token"
    kc = kubeconfig(tmp_path / "kc", {"server": "https://a:1", "certificate-authority": ca_file},
                    {"token": "kc-token"})
    access = load(kubeconfig=kc, apiserver="https://b:2")
    assert (access.host, access.port) == ("b", 2)
    assert access.authorization() == b"Bearer kc-token"
