"""Start-up failures of every program: one line on stderr naming the problem and the flag that
fixes it, exit code 2, no traceback, never a byte of a kubeconfig's content.

Each case runs the real command (``python -m gateway.cli ...`` / ``gateway.access.creds``) as
a new user would, with the mistake made for real: a port held by a listening socket, a missing
file, a kubeconfig that is not YAML, no kubeconfig outside a cluster, PEM files that do not load.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from certs import layout
from gateway.ops import startup
from tests.support import LOOPBACK

HUBPROXY = [sys.executable, "-m", "gateway.cli"]
CREDS = [sys.executable, "-m", "gateway.access.creds"]
SECRET = "s3cr3t-t0ken-never-printed"
EXEC_INFO = ('{"kind":"ExecCredential","apiVersion":"client.authentication.k8s.io/v1",'
             '"spec":{"cluster":{"server":"https://gw/c1","config":{"clusterName":"c1"}}}}')


@pytest.fixture(scope="module")
def files(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("startup")
    layout.init(root / "pki", layout.InitOptions(clusters=["c1"]))
    kubeconfig = root / "hub.kubeconfig"
    kubeconfig.write_text(yaml.safe_dump({
        "apiVersion": "v1", "kind": "Config", "current-context": "hub",
        "clusters": [{"name": "hub", "cluster": {"server": "https://127.0.0.1:1"}}],
        "users": [{"name": "u", "user": {"token": SECRET}}],
        "contexts": [{"name": "hub", "context": {"cluster": "hub", "user": "u"}}],
    }))
    malformed = root / "malformed.kubeconfig"
    # The broken line carries a token: the error must locate it, not quote it.
    malformed.write_text(f"users:\n- name: u\n  user: {{token: [{SECRET}\n")
    junk = root / "junk"
    junk.mkdir()
    (junk / "tls.crt").write_text("not a certificate\n")
    (junk / "tls.key").write_text("not a key\n")
    (junk / "ca.crt").write_text("not a certificate\n")
    token = root / "token"
    token.write_text("agent-token\n")
    return {"root": root, "pki": root / "pki", "kubeconfig": kubeconfig,
            "malformed": malformed, "junk": junk, "token": token}


@pytest.fixture(scope="module")
def busy_port() -> Iterator[int]:
    """A loopback port that another process (here: this one) listens on."""
    with socket.socket() as sock:
        sock.bind((LOOPBACK, 0))
        sock.listen()
        yield int(sock.getsockname()[1])


def _env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("HUBPROXY_", "KUBERNETES_SERVICE_"))}
    env.update(extra)
    return env


def _fails_in_one_line(args: list[str], *needles: str, env: dict[str, str] | None = None
                       ) -> str:
    got = subprocess.run(args, capture_output=True, text=True, timeout=60,
                         env=env or _env())
    lines = [line for line in got.stderr.splitlines() if line.strip()]
    assert got.returncode == startup.EXIT_CODE, (got.returncode, got.stderr)
    assert len(lines) == 1, got.stderr
    assert "Traceback" not in got.stderr and SECRET not in got.stderr + got.stdout
    for needle in needles:
        assert needle in lines[0], (needle, lines[0])
    return lines[0]


def _gateway(files: dict[str, Path], **overrides: str) -> list[str]:
    pki = files["pki"]
    flags = {"--tls-dir": str(pki / "gateway"), "--tunnel-tls-dir": str(pki / "tunnel-server"),
             "--agent-ca": str(pki / "tunnel-ca" / "ca.crt"),
             "--hub-kubeconfig": str(files["kubeconfig"]), "--listen": f"{LOOPBACK}:0",
             "--tunnel-listen": f"{LOOPBACK}:0", "--health-listen": f"{LOOPBACK}:0"}
    flags.update(overrides)
    return [*HUBPROXY, "gateway",
            *[item for flag, value in flags.items() if value is not None
              for item in (flag, value)]]


# --- hubproxy gateway --------------------------------------------------------------------------

@pytest.mark.parametrize("flag", ["--listen", "--tunnel-listen", "--health-listen"])
def test_gateway_port_in_use_names_the_flag(files: dict[str, Path], busy_port: int,
                                            flag: str) -> None:
    _fails_in_one_line(_gateway(files, **{flag: f"{LOOPBACK}:{busy_port}"}),
                       "hubproxy gateway:", flag, str(busy_port), "in use")


def test_gateway_listen_address_not_on_this_machine(files: dict[str, Path]) -> None:
    # 192.0.2.0/24 is TEST-NET-1: never a local address.
    _fails_in_one_line(_gateway(files, **{"--listen": "192.0.2.1:9092"}),
                       "--listen 192.0.2.1:9092", "no interface")


def test_gateway_hub_kubeconfig_missing_file(files: dict[str, Path]) -> None:
    missing = str(files["root"] / "nope.kubeconfig")
    _fails_in_one_line(_gateway(files, **{"--hub-kubeconfig": missing}),
                       f"--hub-kubeconfig {missing}: no such file")


def test_gateway_hub_kubeconfig_malformed_yaml_is_located_not_quoted(
        files: dict[str, Path]) -> None:
    _fails_in_one_line(_gateway(files, **{"--hub-kubeconfig": str(files["malformed"])}),
                       "--hub-kubeconfig", "not valid YAML at line 4")


def test_gateway_hub_kubeconfig_that_is_not_a_kubeconfig(files: dict[str, Path]) -> None:
    _fails_in_one_line(_gateway(files, **{"--hub-kubeconfig": os.devnull}),
                       "--hub-kubeconfig /dev/null: not a kubeconfig")


def test_gateway_hub_kubeconfig_naming_a_missing_context(files: dict[str, Path]) -> None:
    broken = files["root"] / "no-context.kubeconfig"
    broken.write_text("apiVersion: v1\nkind: Config\ncurrent-context: gone\n")
    _fails_in_one_line(_gateway(files, **{"--hub-kubeconfig": str(broken)}),
                       f"--hub-kubeconfig {broken}: cannot use it", "gone")


def test_gateway_outside_a_cluster_without_hub_kubeconfig(files: dict[str, Path]) -> None:
    _fails_in_one_line(_gateway(files, **{"--hub-kubeconfig": None}),
                       "not running in a Kubernetes pod", "--hub-kubeconfig")


def test_gateway_agent_ca_that_is_not_pem(files: dict[str, Path]) -> None:
    bad = str(files["junk"] / "ca.crt")
    _fails_in_one_line(_gateway(files, **{"--agent-ca": bad}),
                       f"--agent-ca {bad}: no PEM CA certificate")


@pytest.mark.parametrize("flag", ["--tls-dir", "--tunnel-tls-dir"])
def test_gateway_tls_dirs_missing_or_not_pem(files: dict[str, Path], flag: str) -> None:
    missing = str(files["root"] / "absent")
    _fails_in_one_line(_gateway(files, **{flag: missing}), f"{flag} {missing}: no such directory")
    junk = str(files["junk"])
    _fails_in_one_line(_gateway(files, **{flag: junk}), f"{flag} {junk}: tls.crt and tls.key "
                       "do not load")


# --- hubproxy agent ----------------------------------------------------------------------------

def _agent(files: dict[str, Path], **overrides: str | None) -> list[str]:
    pki = files["pki"]
    flags: dict[str, str | None] = {
        "--hub": "127.0.0.1:1", "--cluster": "c1", "--tls-dir": str(pki / "agents" / "c1"),
        "--apiserver": "https://127.0.0.1:2", "--apiserver-ca": str(pki / "tunnel-ca" / "ca.crt"),
        "--token-file": str(files["token"]), "--health-listen": "off"}
    flags.update(overrides)
    return [*HUBPROXY, "agent",
            *[item for flag, value in flags.items() if value is not None
              for item in (flag, value)]]


def test_agent_health_port_in_use(files: dict[str, Path], busy_port: int) -> None:
    _fails_in_one_line(_agent(files, **{"--health-listen": f"{LOOPBACK}:{busy_port}"}),
                       "hubproxy agent: --health-listen", "in use")


def test_agent_malformed_kubeconfig_is_located_not_quoted(files: dict[str, Path]) -> None:
    _fails_in_one_line(_agent(files, **{"--kubeconfig": str(files["malformed"]),
                                        "--apiserver": None, "--apiserver-ca": None,
                                        "--token-file": None}),
                       "--kubeconfig", "not valid YAML at line 4")


def test_agent_outside_a_cluster_without_kubeconfig(files: dict[str, Path]) -> None:
    _fails_in_one_line(_agent(files, **{"--apiserver": None, "--apiserver-ca": None,
                                        "--token-file": None}),
                       "not in a cluster", "--kubeconfig")


def test_agent_hub_ca_and_tls_dir(files: dict[str, Path]) -> None:
    bad = str(files["junk"] / "ca.crt")
    _fails_in_one_line(_agent(files, **{"--hub-ca": bad}), f"--hub-ca {bad}: no PEM CA")
    _fails_in_one_line(_agent(files, **{"--tls-dir": str(files["junk"])}),
                       "--tls-dir", "do not load")


# --- hubproxy demo -----------------------------------------------------------------------------

def test_demo_checks_its_port_before_building_anything(tmp_path: Path, busy_port: int) -> None:
    directory = tmp_path / "demo"
    _fails_in_one_line([*HUBPROXY, "demo", "--listen", f"{LOOPBACK}:{busy_port}",
                        "--dir", str(directory)],
                       "hubproxy demo: --listen", "in use")
    assert not directory.exists()  # nothing was built


# --- hubproxy-creds ----------------------------------------------------------------------------

def test_creds_hub_kubeconfig_missing_and_malformed(files: dict[str, Path]) -> None:
    env = _env(KUBERNETES_EXEC_INFO=EXEC_INFO)
    missing = str(files["root"] / "nope.kubeconfig")
    _fails_in_one_line([*CREDS, "--managed-serviceaccount", "msa", "--hub-kubeconfig", missing],
                       f"hubproxy-creds: --hub-kubeconfig {missing}: no such file", env=env)
    _fails_in_one_line([*CREDS, "--managed-serviceaccount", "msa", "--hub-kubeconfig",
                        str(files["malformed"])], "not valid YAML at line 4", env=env)


def test_creds_outside_a_pod_without_any_kubeconfig(files: dict[str, Path]) -> None:
    env = _env(KUBERNETES_EXEC_INFO=EXEC_INFO, KUBECONFIG=str(files["root"] / "none"))
    _fails_in_one_line([*CREDS, "--token-request-audience", "hub"],
                       "not running in a pod", "--hub-kubeconfig", env=env)


# --- versions ----------------------------------------------------------------------------------

def test_both_commands_print_the_package_version() -> None:
    from importlib.metadata import version

    expected = version("hubproxy")
    for command, name in ((HUBPROXY, "hubproxy"), (CREDS, "hubproxy-creds")):
        got = subprocess.run([*command, "--version"], capture_output=True, text=True,
                             timeout=30)
        assert got.returncode == 0 and got.stdout.strip() == f"{name} {expected}"


# --- the pure parts ----------------------------------------------------------------------------

def test_yaml_problem_never_quotes_the_document() -> None:
    with pytest.raises(yaml.YAMLError) as info:
        yaml.safe_load(f"a: [{SECRET}\n")
    assert SECRET in str(info.value)  # what we avoid
    message = startup.yaml_problem(info.value)
    assert SECRET not in message and "line 2" in message


def test_port_zero_is_always_free_and_a_held_port_is_not(busy_port: int) -> None:
    startup.check_port_free(LOOPBACK, 0, "--listen")
    with pytest.raises(startup.StartupError, match=r"--x 127\.0\.0\.1:\d+: the port is in use"):
        startup.check_port_free(LOOPBACK, busy_port, "--x")
