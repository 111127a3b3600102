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
    ("base", "commands"),
    [("deploy/hub", {"gateway"}), ("deploy/agent", {"agent"}),
     ("deploy/examples/agent-cluster1", {"agent"}), ("deploy/ocm", {"gateway", "agent"})],
)
def test_manifest_environment_names_real_flags(base: str, commands: set[str]) -> None:
    rendered = [d for d in yaml.safe_load_all(subprocess.run(
        ["kubectl", "kustomize", str(ROOT / base)], capture_output=True, text=True, check=True,
        timeout=60).stdout) if d]
    deployments = [d for d in rendered if d["kind"] == "Deployment"]
    # The OCM add-on carries the agent's Deployment inside its AddOnTemplate.
    deployments += [m for d in rendered if d["kind"] == "AddOnTemplate"
                    for m in d["spec"]["agentSpec"]["workload"]["manifests"]
                    if m["kind"] == "Deployment"]
    seen = set()
    for deployment in deployments:
        for container in deployment["spec"]["template"]["spec"]["containers"]:
            program, command = container["command"]
            assert program == "hubproxy" and command in commands, container["command"]
            seen.add(command)
            names = {e["name"] for e in container.get("env", [])}
            assert names and names <= env_names_of(command), sorted(names - env_names_of(command))
    assert seen == commands


def test_documented_optional_settings_are_real_flags() -> None:
    """The commented-out ClusterProfile settings in deploy/hub must work when uncommented."""
    text = (ROOT / "deploy/hub/deployment.yaml").read_text()
    documented = {line.split("name:")[1].strip() for line in text.splitlines()
                  if line.strip().startswith("# - name: HUBPROXY_")}
    assert documented == {"HUBPROXY_CLUSTERPROFILES", "HUBPROXY_PUBLIC_URL"}
    assert documented <= env_names_of("gateway")
