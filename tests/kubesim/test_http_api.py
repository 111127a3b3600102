"""kubesim over raw HTTPS (aiohttp): Status shapes, impersonation, reviews, the request log.

Each expected body is what kube-apiserver answers for the same request.
"""

from __future__ import annotations

import json
import ssl
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from kubesim.auth import token_claims
from kubesim.testing import CLUSTERPROFILE_CRD, RunningKubeSim, run_kubesim

USERS = [("alice-token", "alice", "alice-uid", ["devs"]), ("imp-token", "impersonator", "", [])]


@pytest.fixture
async def sim(tmp_path: Path) -> AsyncIterator[RunningKubeSim]:
    async with run_kubesim(tmp_path, users=USERS, crds=[CLUSTERPROFILE_CRD]) as running:
        yield running


class Client:
    def __init__(self, sim: RunningKubeSim, session: aiohttp.ClientSession) -> None:
        self.sim = sim
        self.session = session

    async def call(
        self,
        method: str,
        path: str,
        token: str | None = "admin",
        body: Any = None,
        headers: list[tuple[str, str]] | None = None,
        content_type: str = "application/json",
    ) -> tuple[int, Any]:
        hdrs: list[tuple[str, str]] = list(headers or [])
        if token:
            hdrs.append(
                ("Authorization", f"Bearer {self.sim.admin_token if token == 'admin' else token}")
            )
        data = None
        if body is not None:
            data = body if isinstance(body, bytes | str) else json.dumps(body)
            hdrs.append(("Content-Type", content_type))
        async with self.session.request(
            method, self.sim.url + path, data=data, headers=hdrs
        ) as resp:
            text = await resp.text()
            try:
                return resp.status, json.loads(text)
            except ValueError:
                return resp.status, text


@pytest.fixture
async def api(sim: RunningKubeSim) -> AsyncIterator[Client]:
    ctx = ssl.create_default_context(cafile=sim.ca_file)
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(ssl=ctx)) as session:
        yield Client(sim, session)


def status(
    code: int, reason: str, message: str, details: dict[str, Any] | None = None
) -> dict[str, Any]:
    body: dict[str, Any] = {
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Failure",
        "message": message,
        "reason": reason,
    }
    if details is not None:
        body["details"] = details
    body["code"] = code
    return body


async def test_unauthenticated_and_bad_token_are_401(api: Client) -> None:
    unauthorized = status(401, "Unauthorized", "Unauthorized")
    assert await api.call("GET", "/api/v1/namespaces/default/pods", token=None) == (
        401,
        unauthorized,
    )
    assert await api.call("GET", "/api/v1/namespaces/default/pods", token="wrong") == (
        401,
        unauthorized,
    )
    # an invalid token is refused even on paths anonymous users may read
    assert await api.call("GET", "/healthz", token="wrong") == (401, unauthorized)
    assert await api.call("GET", "/healthz", token=None) == (200, "ok")
    code, version = await api.call("GET", "/version", token=None)
    assert code == 200 and version["major"] == "1"


async def test_not_found_already_exists_conflict(api: Client) -> None:
    cm = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "c1"}, "data": {"a": "1"}}
    path = "/api/v1/namespaces/default/configmaps"
    assert await api.call("GET", f"{path}/c1") == (
        404,
        status(404, "NotFound", 'configmaps "c1" not found', {"name": "c1", "kind": "configmaps"}),
    )
    code, created = await api.call("POST", path, body=cm)
    assert code == 201 and created["metadata"]["resourceVersion"]
    assert await api.call("POST", path, body=cm) == (
        409,
        status(
            409,
            "AlreadyExists",
            'configmaps "c1" already exists',
            {"name": "c1", "kind": "configmaps"},
        ),
    )
    stale = {**cm, "metadata": {"name": "c1", "resourceVersion": "1"}}
    assert await api.call("PUT", f"{path}/c1", body=stale) == (
        409,
        status(
            409,
            "Conflict",
            'Operation cannot be fulfilled on configmaps "c1": the object has been '
            "modified; please apply your changes to the latest version and try again",
            {"name": "c1", "kind": "configmaps"},
        ),
    )
    fresh = {**cm, "metadata": created["metadata"], "data": {"a": "2"}}
    code, updated = await api.call("PUT", f"{path}/c1", body=fresh)
    assert code == 200 and int(updated["metadata"]["resourceVersion"]) > int(
        created["metadata"]["resourceVersion"]
    )
    code, gone = await api.call("DELETE", f"{path}/c1")
    assert code == 200 and gone["status"] == "Success" and gone["details"]["name"] == "c1"
    ns_missing = await api.call("POST", "/api/v1/namespaces/nope/configmaps", body=cm)
    assert ns_missing == (
        404,
        status(
            404, "NotFound", 'namespaces "nope" not found', {"name": "nope", "kind": "namespaces"}
        ),
    )


async def test_malformed_json_unknown_resource_and_method(api: Client) -> None:
    path = "/api/v1/namespaces/default/configmaps"
    assert await api.call("POST", path, body=b"{bad") == (
        400,
        status(
            400,
            "BadRequest",
            "couldn't get version/kind; json parse error: invalid character 'b' looking for "
            "beginning of object key string",
        ),
    )
    not_found = status(404, "NotFound", "the server could not find the requested resource", {})
    assert await api.call("GET", "/api/v1/namespaces/default/widgets") == (404, not_found)
    # No API group owns the path: Go's plain-text 404, as a real apiserver answers.
    assert await api.call("GET", "/apis/example.com/v1/widgets") == (404, "404 page not found\n")
    assert await api.call("GET", "/apis/authentication.k8s.io/v1/tokenreviews") == (
        405,
        status(
            405,
            "MethodNotAllowed",
            "the server does not allow this method on the requested resource",
            {},
        ),
    )
    invalid = await api.call("POST", path, body={"metadata": {"name": "Bad_Name"}})
    assert invalid[0] == 422 and invalid[1]["reason"] == "Invalid"
    assert invalid[1]["details"]["causes"][0]["field"] == "metadata.name"


async def test_forbidden_messages(api: Client) -> None:
    code, body = await api.call("GET", "/api/v1/namespaces/default/pods/web", token="alice-token")
    assert (code, body) == (
        403,
        status(
            403,
            "Forbidden",
            'pods "web" is forbidden: User "alice" cannot get resource "pods" in API '
            'group "" in the namespace "default"',
            {"name": "web", "kind": "pods"},
        ),
    )
    code, body = await api.call(
        "GET", "/api/v1/namespaces/default/pods/web/log", token="alice-token"
    )
    assert body["message"].endswith(
        'cannot get resource "pods/log" in API group "" in the namespace "default"'
    )
    code, body = await api.call(
        "GET", "/apis/rbac.authorization.k8s.io/v1/clusterroles", token="alice-token"
    )
    assert body["message"] == (
        'clusterroles.rbac.authorization.k8s.io is forbidden: User "alice" cannot '
        'list resource "clusterroles" in API group "rbac.authorization.k8s.io" '
        "at the cluster scope"
    )
    assert body["details"] == {"group": "rbac.authorization.k8s.io", "kind": "clusterroles"}
    assert await api.call("GET", "/metrics", token="alice-token") == (
        403,
        status(403, "Forbidden", 'forbidden: User "alice" cannot get path "/metrics"', {}),
    )


async def test_rbac_grants_resource_names_subresources_nonresource(
    api: Client, sim: RunningKubeSim
) -> None:
    sim.apply(
        {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": "web", "namespace": "default"},
            "spec": {"containers": [{"name": "c", "image": "busybox"}]},
        }
    )
    sim.grant("User:alice", ["get"], ["pods"], namespace="default", resource_names=["web"])
    sim.grant("Group:devs", ["get"], ["*/status"])
    sim.grant("User:alice", ["get"], non_resource_urls=["/metrics", "/debug/*"])
    assert (await api.call("GET", "/api/v1/namespaces/default/pods/web", token="alice-token"))[
        0
    ] == 200
    assert (await api.call("GET", "/api/v1/namespaces/default/pods", token="alice-token"))[0] == 403
    assert (
        await api.call("GET", "/api/v1/namespaces/default/pods/web/status", token="alice-token")
    )[0] == 200
    assert (await api.call("GET", "/api/v1/namespaces/default/pods/web/log", token="alice-token"))[
        0
    ] == 403
    assert (await api.call("GET", "/metrics", token="alice-token"))[0] == 404  # allowed, not served
    sa_token = sim.mint_token("default", "runner")
    sim.grant("ServiceAccount:default:runner", ["list"], ["configmaps"], namespace="default")
    assert (await api.call("GET", "/api/v1/namespaces/default/configmaps", token=sa_token))[
        0
    ] == 200
    assert (await api.call("GET", "/api/v1/namespaces/kube-system/configmaps", token=sa_token))[
        0
    ] == 403


async def test_impersonation_like_kube_apiserver(api: Client, sim: RunningKubeSim) -> None:
    ssr = {"apiVersion": "authentication.k8s.io/v1", "kind": "SelfSubjectReview"}
    path = "/apis/authentication.k8s.io/v1/selfsubjectreviews"
    hdrs = [
        ("Impersonate-User", "bob"),
        ("Impersonate-Group", "g1"),
        ("Impersonate-Group", "g2"),
        ("Impersonate-Uid", "u-1"),
        ("Impersonate-Extra-Scopes", "view"),
        ("Impersonate-Extra-Acme.com%2Fproject", "p1"),
        ("Impersonate-Extra-Acme.com%2Fproject", "p2"),
    ]
    code, body = await api.call("POST", path, body=ssr, headers=hdrs)
    assert code == 201
    assert body["status"]["userInfo"] == {
        "username": "bob",
        "uid": "u-1",
        "groups": ["g1", "g2", "system:authenticated"],
        "extra": {"scopes": ["view"], "acme.com/project": ["p1", "p2"]},
    }

    # each value needs its own `impersonate` grant, with the real resource mapping; a refusal
    # is worded as 1.36's constrained-impersonation check on the request itself
    imp = "imp-token"
    code, body = await api.call(
        "POST", path, token=imp, body=ssr, headers=[("Impersonate-User", "bob")]
    )
    assert (code, body["message"]) == (
        403,
        'selfsubjectreviews.authentication.k8s.io is forbidden: User "impersonator" cannot '
        'impersonate-on:user-info:create resource "selfsubjectreviews" in API group '
        '"authentication.k8s.io" at the cluster scope'
    )
    sim.grant("User:impersonator", ["impersonate"], ["users"], resource_names=["bob"])
    code, body = await api.call(
        "POST", path, token=imp, body=ssr, headers=[("Impersonate-User", "bob")]
    )
    assert code == 201 and body["status"]["userInfo"]["groups"] == ["system:authenticated"]
    code, body = await api.call(
        "POST",
        path,
        token=imp,
        body=ssr,
        headers=[("Impersonate-User", "bob"), ("Impersonate-Group", "admins")],
    )
    assert body["message"] == (
        'selfsubjectreviews.authentication.k8s.io is forbidden: User "impersonator" cannot '
        'impersonate-on:user-info:create resource "selfsubjectreviews" in API group '
        '"authentication.k8s.io" at the cluster scope'
    )
    code, body = await api.call(
        "POST",
        path,
        token=imp,
        body=ssr,
        headers=[("Impersonate-User", "bob"), ("Impersonate-Uid", "u-1")],
    )
    assert body["message"] == (
        'selfsubjectreviews.authentication.k8s.io is forbidden: User "impersonator" cannot '
        'impersonate-on:user-info:create resource "selfsubjectreviews" in API group '
        '"authentication.k8s.io" at the cluster scope'
    )
    code, body = await api.call(
        "POST",
        path,
        token=imp,
        body=ssr,
        headers=[("Impersonate-User", "bob"), ("Impersonate-Extra-Scopes", "x")],
    )
    assert body["message"] == (
        'selfsubjectreviews.authentication.k8s.io is forbidden: User "impersonator" cannot '
        'impersonate-on:user-info:create resource "selfsubjectreviews" in API group '
        '"authentication.k8s.io" at the cluster scope'
    )
    code, body = await api.call(
        "POST",
        path,
        token=imp,
        body=ssr,
        headers=[("Impersonate-User", "system:serviceaccount:team:robot")],
    )
    assert body["message"] == (
        'selfsubjectreviews.authentication.k8s.io is forbidden: User "impersonator" cannot '
        'impersonate-on:serviceaccount:create resource "selfsubjectreviews" in API group '
        '"authentication.k8s.io" at the cluster scope'
    )
    # groups without a user: a 400 Status from kube-apiserver 1.36
    code, body = await api.call("GET", "/api", headers=[("Impersonate-Group", "g1")])
    assert (code, body["reason"]) == (400, "BadRequest")
    assert body["message"] == (
        'requested &user.DefaultInfo{Name:"", UID:"", Groups:[]string{"g1"}, '
        "Extra:map[string][]string(nil)} without impersonating a user name")


async def test_request_log_records_what_arrived(api: Client, sim: RunningKubeSim) -> None:
    await api.call(
        "GET",
        "/api/v1/namespaces/default/configmaps?limit=1",
        headers=[("Impersonate-User", "bob")],
    )
    record = sim.requests_to("/api/v1/namespaces/default/configmaps")[-1]
    assert record.method == "GET" and record.path.endswith("?limit=1")
    assert record.header("Authorization") == [f"Bearer {sim.admin_token}"]
    assert record.user == "kubesim-admin" and record.acting_as == "bob" and record.status == 403


async def test_token_review_audiences(api: Client, sim: RunningKubeSim) -> None:
    sim.grant("User:alice", ["create"], ["tokenreviews"], api_groups=["authentication.k8s.io"])
    path = "/apis/authentication.k8s.io/v1/tokenreviews"

    def review(token: str, audiences: list[str] | None = None) -> dict[str, Any]:
        spec: dict[str, Any] = {"token": token}
        if audiences is not None:
            spec["audiences"] = audiences
        return {"apiVersion": "authentication.k8s.io/v1", "kind": "TokenReview", "spec": spec}

    hub = sim.mint_token("apps", "client", audiences=["hubproxy", "other"])
    code, body = await api.call(
        "POST", path, token="alice-token", body=review(hub, ["hubproxy", "x"])
    )
    assert code == 201
    assert body["status"]["authenticated"] is True
    assert body["status"]["audiences"] == ["hubproxy"]
    user = body["status"]["user"]
    assert user["username"] == "system:serviceaccount:apps:client"
    assert user["groups"] == [
        "system:serviceaccounts",
        "system:serviceaccounts:apps",
        "system:authenticated",
    ]
    assert list(user["extra"]) == ["authentication.kubernetes.io/credential-id"]
    # the API audience is not in this token, so without spec.audiences it is rejected
    code, body = await api.call("POST", path, token="alice-token", body=review(hub))
    assert "authenticated" not in body["status"] and body["status"]["user"] == {}
    assert "invalid bearer token" in body["status"]["error"]
    code, body = await api.call("POST", path, token="alice-token", body=review("garbage"))
    assert code == 201 and body["status"]["error"] and "authenticated" not in body["status"]
    # static tokens are valid for the API audiences only
    code, body = await api.call("POST", path, token="alice-token", body=review("alice-token"))
    assert body["status"]["authenticated"] is True and body["status"]["user"]["username"] == "alice"
    assert body["status"]["audiences"] == ["https://kubernetes.default.svc.cluster.local"]
    code, body = await api.call(
        "POST", path, token="alice-token", body=review("alice-token", ["hubproxy"])
    )
    assert "authenticated" not in body["status"]
    # callers need RBAC to create tokenreviews
    code, body = await api.call("POST", path, token="imp-token", body=review(hub))
    assert code == 403
    # deleting the ServiceAccount invalidates its tokens
    await api.call("DELETE", "/api/v1/namespaces/apps/serviceaccounts/client")
    code, body = await api.call("POST", path, token="alice-token", body=review(hub, ["hubproxy"]))
    assert "authenticated" not in body["status"]


async def test_token_request_and_subject_access_review(api: Client, sim: RunningKubeSim) -> None:
    sim.apply(
        {
            "apiVersion": "v1",
            "kind": "ServiceAccount",
            "metadata": {"name": "robot", "namespace": "default"},
        }
    )
    code, body = await api.call(
        "POST",
        "/api/v1/namespaces/default/serviceaccounts/robot/token",
        body={
            "apiVersion": "authentication.k8s.io/v1",
            "kind": "TokenRequest",
            "spec": {"audiences": ["hubproxy"], "expirationSeconds": 900},
        },
    )
    assert code == 201 and body["spec"]["expirationSeconds"] == 900
    claims = token_claims(body["status"]["token"])
    assert claims["aud"] == ["hubproxy"] and claims["sub"] == "system:serviceaccount:default:robot"
    assert claims["exp"] - claims["iat"] == 900
    assert claims["kubernetes.io"]["serviceaccount"]["name"] == "robot"
    code, body = await api.call(
        "POST",
        "/api/v1/namespaces/default/serviceaccounts/robot/token",
        body={"spec": {"expirationSeconds": 60}},
    )
    assert code == 422 and "may not specify a duration less than 10 minutes" in body["message"]

    sar = {
        "apiVersion": "authorization.k8s.io/v1",
        "kind": "SubjectAccessReview",
        "spec": {
            "user": "alice",
            "groups": ["devs"],
            "resourceAttributes": {
                "group": "cluster.open-cluster-management.io",
                "resource": "managedclusters",
                "subresource": "proxy",
                "verb": "get",
                "name": "cluster1",
            },
        },
    }
    path = "/apis/authorization.k8s.io/v1/subjectaccessreviews"
    code, body = await api.call("POST", path, body=sar)
    assert code == 201 and body["status"] == {"allowed": False}
    sim.grant(
        "Group:devs",
        ["get"],
        ["managedclusters/proxy"],
        api_groups=["cluster.open-cluster-management.io"],
        resource_names=["cluster1"],
        name="proxy",
    )
    code, body = await api.call("POST", path, body=sar)
    assert body["status"]["allowed"] is True
    assert body["status"]["reason"] == (
        'RBAC: allowed by ClusterRoleBinding "proxy" of ClusterRole "proxy" to Group "devs"'
    )


async def test_pod_stream_subresources_are_authorized_before_streams(
    api: Client, sim: RunningKubeSim, monkeypatch: pytest.MonkeyPatch
) -> None:
    sim.apply(
        {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": "web", "namespace": "default"},
            "spec": {"containers": [{"name": "c", "image": "busybox"}]},
        }
    )
    sim.grant("User:alice", ["get"], ["pods/exec", "pods/log"], namespace="default")
    # a WebSocket exec is a GET, but since 1.30 it also needs `create` on pods/exec
    code, body = await api.call(
        "GET", "/api/v1/namespaces/default/pods/web/exec?command=ls", token="alice-token"
    )
    assert (code, body["message"]) == (
        403,
        'pods "web" is forbidden: User "alice" cannot create '
        'resource "pods/exec" in API group "" in the namespace '
        '"default"',
    )
    code, body = await api.call(
        "GET", "/api/v1/namespaces/default/pods/nope/log", token="alice-token"
    )
    assert (code, body["message"]) == (404, 'pods "nope" not found')
    # without kubesim.streams, authorized stream requests get a 501 Status
    monkeypatch.setitem(__import__("sys").modules, "kubesim.streams", None)
    code, body = await api.call(
        "GET", "/api/v1/namespaces/default/pods/web/log", token="alice-token"
    )
    assert code == 501 and body["kind"] == "Status"


async def test_token_request_bound_to_a_pod(api: Client, sim: RunningKubeSim) -> None:
    sim.apply(
        {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": "web", "namespace": "default"},
            "spec": {"containers": [{"name": "c", "image": "busybox"}]},
        }
    )
    path = "/api/v1/namespaces/default/serviceaccounts/default/token"
    ref = {"kind": "Pod", "apiVersion": "v1", "name": "web"}
    code, body = await api.call("POST", path, body={"spec": {"boundObjectRef": ref}})
    assert code == 201
    claims = token_claims(body["status"]["token"])
    assert claims["kubernetes.io"]["pod"]["name"] == "web"
    assert claims["kubernetes.io"]["pod"]["uid"] == body["spec"]["boundObjectRef"]["uid"]
    code, body = await api.call(
        "POST", path, body={"spec": {"boundObjectRef": {**ref, "name": "gone"}}}
    )
    assert (code, body["message"]) == (404, 'pods "gone" not found')


async def test_audit_id_is_the_requests_or_a_fresh_one(api: Client) -> None:
    """As kube-apiserver's audit filter: the Audit-ID a request brings is its audit ID and is
    echoed back as Audit-Id; without one, each response gets a fresh UUID."""
    url = api.sim.url + "/api/v1/namespaces/default/configmaps"
    auth = {"Authorization": f"Bearer {api.sim.admin_token}"}
    async with api.session.get(url, headers={**auth, "Audit-ID": "0a1b2c3d"}) as resp:
        assert resp.headers["Audit-Id"] == "0a1b2c3d"
    fresh = []
    for _ in range(2):
        async with api.session.get(url, headers=auth) as resp:
            fresh.append(resp.headers["Audit-Id"])
    assert len(set(fresh)) == 2 and "0a1b2c3d" not in fresh
