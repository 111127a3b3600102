"""Why the gateway refuses encoded separators in Kubernetes API paths (issue 14 item 2), shown on
the real kube-apiserver: it decodes ``%2F`` before routing, so a path the gateway would have
routed and audited as one thing is served as another. Through the gateway it is a 400."""

from __future__ import annotations

from tests.realkube.conftest import Fleet
from tests.realkube.hubproxy import CLUSTER


def test_the_real_apiserver_decodes_an_encoded_slash(fleet: Fleet) -> None:
    fleet.kube.managed.admin("create", "configmap", "decoded", "-n", "team",
                             "--from-literal=k=v")
    try:
        # One "namespace" segment to a proxy that does not decode; the apiserver decodes it and
        # lists the ConfigMaps of namespace "team".
        status, body = fleet.kube.managed.request("GET", "/api/v1/namespaces/team%2Fconfigmaps")
        assert status == 200, body
        assert body["kind"] == "ConfigMapList"
        assert "decoded" in {item["metadata"]["name"] for item in body["items"]}
        # Through the gateway the same path never reaches the managed apiserver.
        code, answer = fleet.gateway.curl_json(f"/{CLUSTER}/api/v1/namespaces/team%2Fconfigmaps",
                                               fleet.alice)
        assert code == 400 and answer["reason"] == "BadRequest", answer
        assert "encoded slash" in answer["message"]
    finally:
        fleet.kube.managed.admin("delete", "configmap", "decoded", "-n", "team")
