"""The manifests `cluster add` prints stay deploy/agent's, plus exactly what joining needs."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from gateway.hub.join.manifests import (
    CREDENTIALS,
    DEFAULT_PROFILE,
    IMPERSONATOR,
    LEGACY,
    READ_ONLY,
    agent_manifests,
    profile_of,
)

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


PROFILE_RULES = AGENT / "profiles" / "read-only" / "rbac.yaml"


def test_each_profile_renders_deploy_agents_rules() -> None:
    read_only = yaml.safe_load(PROFILE_RULES.read_text())["rules"]
    for profile, rules in ((LEGACY, base("ClusterRole")["rules"]), (READ_ONLY, read_only)):
        objects = agent_manifests(cluster="c1", hub="hub:8091", token="T", hub_ca_pem="CA",
                                  profile=profile)
        (role,) = rendered("ClusterRole", objects)
        assert role["metadata"]["name"] == IMPERSONATOR
        assert role["rules"] == rules
        assert profile_of(role["rules"]) == profile
    assert DEFAULT_PROFILE == LEGACY == profile_of(base("ClusterRole")["rules"])


def test_profile_of_reads_rules_as_rbac_does() -> None:
    legacy = base("ClusterRole")["rules"]
    # Order of rules and of values does not matter; an empty list is no list.
    shuffled = [{**rule, "verbs": list(reversed(rule["verbs"])), "resourceNames": []}
                for rule in reversed(legacy)]
    assert profile_of(shuffled) == LEGACY
    # Anything else is no profile: a verb more, a rule less, nothing at all.
    assert profile_of([*legacy, {"apiGroups": [""], "resources": ["pods"],
                                 "verbs": ["get"]}]) is None
    assert profile_of(legacy[:1]) is None
    assert profile_of([]) is None
