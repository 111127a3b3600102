"""Every HUBPROXY_* variable the manifests set names a real flag of the command they run."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
import yaml

from gateway.cli import build_parser, env_name

ROOT = Path(__file__).resolve().parents[1]


def env_names_of(command: str) -> set[str]:
    parser = build_parser()
    sub = parser._subparsers._group_actions[0].choices[command]  # type: ignore[union-attr]
    return {
        env_name(option)
        for action in sub._actions
        for option in action.option_strings
        if option.startswith("--") and option != "--help"
    }


@pytest.mark.parametrize(
    ("base", "command"),
    [("deploy/hub", "gateway"), ("deploy/agent", "agent"),
     ("deploy/examples/agent-cluster1", "agent")],
)
def test_manifest_environment_names_real_flags(base: str, command: str) -> None:
    rendered = subprocess.run(["kubectl", "kustomize", str(ROOT / base)], capture_output=True,
                              text=True, check=True, timeout=60).stdout
    deployments = [d for d in yaml.safe_load_all(rendered) if d and d["kind"] == "Deployment"]
    assert deployments
    known = env_names_of(command)
    for deployment in deployments:
        for container in deployment["spec"]["template"]["spec"]["containers"]:
            assert container["command"] == ["hubproxy", command]
            names = {e["name"] for e in container.get("env", [])}
            assert names and names <= known, sorted(names - known)


def test_documented_optional_settings_are_real_flags() -> None:
    """The commented-out ClusterProfile settings in deploy/hub must work when uncommented."""
    text = (ROOT / "deploy/hub/deployment.yaml").read_text()
    documented = {line.split("name:")[1].strip() for line in text.splitlines()
                  if line.strip().startswith("# - name: HUBPROXY_")}
    assert documented == {"HUBPROXY_CLUSTERPROFILES", "HUBPROXY_PUBLIC_URL"}
    assert documented <= env_names_of("gateway")
