"""`hubproxy certs init | issue-agent | show`: modes, --force, cluster names, output."""

from __future__ import annotations

import stat
import subprocess
import sys
from pathlib import Path

import pytest
from cryptography import x509

from certs.identity import validate_cluster_name
from gateway.cli import main


def hubproxy(*args: str) -> int:
    return main(["certs", *map(str, args)])


def mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def serial(path: Path) -> int:
    return x509.load_pem_x509_certificate(path.read_bytes()).serial_number


def test_init_writes_the_layout_with_private_keys_0600(tmp_path: Path) -> None:
    assert hubproxy("init", tmp_path, "--cluster", "c1", "--cluster", "c2") == 0
    keys = sorted(tmp_path.rglob("*.key"))
    assert [k.relative_to(tmp_path).as_posix() for k in keys] == [
        "agents/c1/tls.key", "agents/c2/tls.key", "front-ca/ca.key", "gateway/tls.key",
        "tunnel-ca/ca.key", "tunnel-server/tls.key",
    ]
    for key in keys:
        assert mode(key) == 0o600, key
    for cert in tmp_path.rglob("*.crt"):
        assert mode(cert) == 0o644, cert
    assert not list(tmp_path.rglob("*.tmp")), "no temporary files left behind"


def test_keys_are_0600_even_with_a_permissive_umask(tmp_path: Path) -> None:
    import os

    old = os.umask(0)
    try:
        assert hubproxy("init", tmp_path, "--cluster", "c1") == 0
    finally:
        os.umask(old)
    assert mode(tmp_path / "agents/c1/tls.key") == 0o600
    assert mode(tmp_path / "tunnel-ca/ca.key") == 0o600


def test_init_never_overwrites_without_force(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    assert hubproxy("init", tmp_path, "--cluster", "c1") == 0
    before = {p: p.read_bytes() for p in tmp_path.rglob("*") if p.is_file()}
    capsys.readouterr()
    # Adding a cluster to an existing tree is issue-agent's job: init refuses and writes nothing.
    assert hubproxy("init", tmp_path, "--cluster", "c1", "--cluster", "c2") == 1
    err = capsys.readouterr().err
    assert "refusing to overwrite" in err and "--force" in err
    assert {p: p.read_bytes() for p in tmp_path.rglob("*") if p.is_file()} == before
    assert not (tmp_path / "agents/c2").exists()

    assert hubproxy("init", tmp_path, "--cluster", "c1", "--force") == 0
    after = {p: p.read_bytes() for p in tmp_path.rglob("*") if p.is_file()}
    assert set(after) == set(before)
    assert all(after[p] != before[p] for p in before), "--force replaces every file"
    assert mode(tmp_path / "agents/c1/tls.key") == 0o600


def test_issue_agent_uses_the_existing_tunnel_ca(tmp_path: Path) -> None:
    assert hubproxy("init", tmp_path) == 0
    assert hubproxy("issue-agent", tmp_path, "--cluster", "edge-7") == 0
    agent = tmp_path / "agents/edge-7"
    assert (agent / "ca.crt").read_bytes() == (tmp_path / "tunnel-ca/ca.crt").read_bytes()
    assert mode(agent / "tls.key") == 0o600
    result = subprocess.run(
        ["openssl", "verify", "-CAfile", str(agent / "ca.crt"), str(agent / "tls.crt")],
        capture_output=True, text=True, timeout=30,
    )
    assert result.returncode == 0, result.stderr

    first = serial(agent / "tls.crt")
    assert hubproxy("issue-agent", tmp_path, "--cluster", "edge-7") == 1
    assert serial(agent / "tls.crt") == first
    assert hubproxy("issue-agent", tmp_path, "--cluster", "edge-7", "--force", "--key-type",
                    "rsa") == 0
    assert serial(agent / "tls.crt") != first


def test_issue_agent_without_ca_is_a_clear_error(tmp_path: Path, capsys) -> None:
    assert hubproxy("issue-agent", tmp_path, "--cluster", "c1") == 1
    assert "no tunnel CA" in capsys.readouterr().err
    assert not (tmp_path / "agents").exists()


@pytest.mark.parametrize(
    "name",
    ["C1", "-c1", "c1-", "c_1", "c1/..", "..", "a..b", "", "c 1", "x" * 64, "a." * 127 + "bb"],
)
def test_invalid_cluster_names_are_refused(tmp_path: Path, name: str, capsys) -> None:
    with pytest.raises(ValueError):
        validate_cluster_name(name)
    assert hubproxy("init", tmp_path / "out", f"--cluster={name}") == 1
    err = capsys.readouterr().err
    assert "cluster name" in err
    assert not (tmp_path / "out").exists(), "nothing is written when a name is refused"


@pytest.mark.parametrize("name", ["c1", "cluster-1", "prod.eu-west", "0", "a" * 63])
def test_valid_cluster_names(name: str) -> None:
    assert validate_cluster_name(name) == name


def test_show_prints_subject_sans_validity_issuer_and_cluster(tmp_path: Path, capsys) -> None:
    assert hubproxy("init", tmp_path, "--cluster", "prod.eu-west", "--days", "30",
                    "--gateway-san", "gw.example.com", "--gateway-san", "10.1.2.3") == 0
    capsys.readouterr()
    assert hubproxy("show", tmp_path / "agents/prod.eu-west/tls.crt") == 0
    out = capsys.readouterr().out
    cert = x509.load_pem_x509_certificate((tmp_path / "agents/prod.eu-west/tls.crt").read_bytes())
    assert "subject: CN=prod.eu-west" in out
    assert "issuer: CN=hubproxy tunnel CA" in out
    assert "sans: URI:hubproxy://cluster/prod.eu-west" in out
    assert f"not after: {cert.not_valid_after_utc.isoformat()}" in out
    assert f"not before: {cert.not_valid_before_utc.isoformat()}" in out
    assert "extended key usage: clientAuth" in out
    assert "cluster: prod.eu-west" in out.splitlines()

    assert hubproxy("show", tmp_path / "gateway/tls.crt") == 0
    out = capsys.readouterr().out
    assert "sans: DNS:gw.example.com, IP:10.1.2.3" in out
    assert "issuer: CN=hubproxy front CA" in out
    assert "cluster: (none: not an agent certificate)" in out


def test_show_of_a_non_certificate_fails_cleanly(tmp_path: Path, capsys) -> None:
    junk = tmp_path / "junk.pem"
    junk.write_text("not a certificate\n")
    assert hubproxy("show", junk) == 1
    assert "no PEM certificate" in capsys.readouterr().err


def test_console_entry_point_runs_as_a_process(tmp_path: Path) -> None:
    result = subprocess.run(
        [sys.executable, "-m", "gateway.cli", "certs", "init", str(tmp_path), "--cluster", "c1",
         "--key-type", "rsa"],
        capture_output=True, text=True, timeout=60, cwd=Path(__file__).resolve().parents[2],
    )
    assert result.returncode == 0, result.stderr
    assert f"wrote {tmp_path / 'agents/c1'}" in result.stdout
    assert "BEGIN" not in result.stdout + result.stderr, "no key material on the terminal"
