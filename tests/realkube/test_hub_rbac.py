"""The gateway on a real hub with exactly deploy/hub's RBAC and a token of its ServiceAccount.

What the gateway calls (TokenReview, SubjectAccessReview) is allowed; anything else, such as
reading Secrets, is refused by the real RBAC authorizer; and the hub's audit log shows that
the gateway made its reviews as that ServiceAccount.
"""

from __future__ import annotations

import json

from tests.realkube.conftest import CLUSTER, GATEWAY_SA, Fleet

GATEWAY_USER = "system:serviceaccount:{}:{}".format(*GATEWAY_SA)


def gateway_token(fleet: Fleet) -> str:
    return next(t for t in fleet.tokens if t in fleet.gateway_kubeconfig.read_text())


def test_gateway_serviceaccount_may_review_tokens_and_access(fleet: Fleet) -> None:
    token = gateway_token(fleet)
    code, review = fleet.hub.request("POST", "/apis/authentication.k8s.io/v1/tokenreviews", {
        "apiVersion": "authentication.k8s.io/v1", "kind": "TokenReview",
        "spec": {"token": fleet.alice}}, token=token)
    assert code == 201, review
    assert review["status"]["authenticated"] is True
    assert review["status"]["user"]["username"] == "system:serviceaccount:fleet:alice"
    assert review["status"]["user"]["uid"] == fleet.alice_uid

    attributes = {"group": "cluster.open-cluster-management.io", "resource": "managedclusters",
                  "subresource": "proxy", "name": CLUSTER, "verb": "get"}
    answers = {}
    # The groups a real TokenReview gives a ServiceAccount, as the gateway passes them on. (This
    # apiserver build's OpenShift "browsersafe" authorizer turns a `proxy` subresource into
    # `unsafeproxy` for a user outside system:authenticated, and denies it.)
    groups = ["system:serviceaccounts", "system:serviceaccounts:fleet", "system:authenticated"]
    for who in ("alice", "bob"):
        code, sar = fleet.hub.request(
            "POST", "/apis/authorization.k8s.io/v1/subjectaccessreviews",
            {"apiVersion": "authorization.k8s.io/v1", "kind": "SubjectAccessReview",
             "spec": {"user": f"system:serviceaccount:fleet:{who}",
                      "groups": groups,
                      "resourceAttributes": attributes}}, token=token)
        assert code == 201, sar
        answers[who] = sar["status"].get("allowed", False)
    assert answers == {"alice": True, "bob": False}


def test_gateway_serviceaccount_may_not_read_secrets(fleet: Fleet) -> None:
    for namespace in ("hubproxy", "fleet", "kube-system"):
        denied = fleet.hub.kubectl("get", "secrets", "-n", namespace,
                                   kubeconfig=fleet.gateway_kubeconfig)
        assert denied.returncode != 0
        assert f'User "{GATEWAY_USER}" cannot list resource "secrets"' in denied.stderr
    can_i = fleet.hub.kubectl("auth", "can-i", "--list", kubeconfig=fleet.gateway_kubeconfig)
    assert can_i.returncode == 0, can_i.stderr
    rules = can_i.stdout
    assert "tokenreviews.authentication.k8s.io" in rules
    assert "subjectaccessreviews.authorization.k8s.io" in rules
    assert "secrets" not in rules


def test_gateway_admits_the_hub_authorized_user_only(fleet: Fleet) -> None:
    assert fleet.gateway.curl(f"/{CLUSTER}/api", fleet.alice)[0] == 200
    code, status = fleet.gateway.curl_json(f"/{CLUSTER}/api", fleet.bob)
    assert code == 403, status
    assert status["kind"] == "Status" and status["code"] == 403
    # The decisions were the real hub's: the gateway's ServiceAccount created the reviews.
    events = fleet.hub.audit_events()
    reviews = [e for e in events if e["verb"] == "create" and e.get("objectRef", {}).get(
        "resource") in ("tokenreviews", "subjectaccessreviews")]
    by = {(e["objectRef"]["resource"], e["user"]["username"], e["responseStatus"]["code"])
          for e in reviews}
    assert ("tokenreviews", GATEWAY_USER, 201) in by
    assert ("subjectaccessreviews", GATEWAY_USER, 201) in by
    assert fleet.alice not in json.dumps(events)
