"""The manifests `cluster add` prints stay deploy/agent's, plus exactly what joining needs."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from gateway.hub.join.manifests import CREDENTIALS, agent_manifests

AGENT = Path(__file__).resolve().parents[4] / "deploy" / "agent"


def base(kind: str) -> dict[str, Any]:
    for path in AGENT.glob("*.yaml"):
        for doc in yaml.safe_load_all(path.read_text()):
            if doc and doc.get("kind") == kind:
                return dict(doc)
    raise AssertionError(kind)


def rendered(kind: str, objects: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [o for o in objects if o["kind"] == kind]


def test_printed_manifests_follow_deploy_agent() -> None:
    objects = agent_manifests(cluster="c1", hub="hub:8091", token="T", hub_ca_pem="CA")
    assert rendered("ClusterRole", objects)[0]["rules"] == base("ClusterRole")["rules"]
    assert rendered("ClusterRoleBinding", objects)[0]["subjects"][0]["name"] == \
        base("ClusterRoleBinding")["subjects"][0]["name"]
    ours = rendered("Deployment", objects)[0]["spec"]["template"]["spec"]
    theirs = base("Deployment")["spec"]["template"]["spec"]
    assert ours["securityContext"] == theirs["securityContext"]
    assert ours["serviceAccountName"] == theirs["serviceAccountName"]
    assert ours["containers"][0]["securityContext"] == theirs["containers"][0]["securityContext"]
    assert ours["containers"][0]["resources"] == theirs["containers"][0]["resources"]
    assert rendered("Namespace", objects)[0]["metadata"]["labels"][
        "pod-security.kubernetes.io/enforce"] == "restricted"


def test_the_agent_may_touch_its_one_secret_only() -> None:
    objects = agent_manifests(cluster="c1", hub="hub:8091", token="T", hub_ca_pem="CA")
    (role,) = rendered("Role", objects)
    assert role["rules"] == [{"apiGroups": [""], "resources": ["secrets"],
                              "resourceNames": [CREDENTIALS], "verbs": ["get", "update"]}]
    (secret,) = rendered("Secret", objects)
    assert secret["metadata"]["name"] == CREDENTIALS
    assert secret["stringData"] == {"join-token": "T", "ca.crt": "CA"}
    env = {e["name"]: e["value"] for e in
           rendered("Deployment", objects)[0]["spec"]["template"]["spec"]["containers"][0]["env"]}
    assert env["HUBPROXY_CLUSTER"] == "c1" and env["HUBPROXY_HUB"] == "hub:8091"
    assert "T" not in env.values()  # the token is only in the Secret
