"""Pure pieces of kubesim: selectors, patches, schema validation, protobuf, tokens, RequestInfo."""

from __future__ import annotations

import time

import pytest
import yaml

from kubesim import patch, protobuf, requestinfo, schema
from kubesim.auth import (
    AuthenticationFailed,
    Authenticator,
    StaticUser,
    UserInfo,
    parse_token_file,
    token_claims,
)
from kubesim.impersonation import impersonate
from kubesim.selectors import parse_field_selector, parse_label_selector
from kubesim.status import StatusError
from kubesim.testing import CLUSTERPROFILE_CRD


@pytest.mark.parametrize(
    ("selector", "labels", "expected"),
    [
        ("a=b", {"a": "b"}, True),
        ("a==b", {"a": "c"}, False),
        ("a!=b", {}, True),
        ("a in (x, y)", {"a": "y"}, True),
        ("a notin (x)", {}, True),
        ("a notin (x)", {"a": "x"}, False),
        ("a", {"a": ""}, True),
        ("!a", {"a": "1"}, False),
        ("a=b,!c,d in (e)", {"a": "b", "d": "e"}, True),
    ],
)
def test_label_selector(selector: str, labels: dict[str, str], expected: bool) -> None:
    assert parse_label_selector(selector)(labels) is expected


def test_selector_errors() -> None:
    with pytest.raises(ValueError):
        parse_label_selector("a in x")
    with pytest.raises(ValueError, match=r"field label not supported: spec\.foo"):
        parse_field_selector("spec.foo=1")
    pred = parse_field_selector("metadata.namespace!=kube-system")
    assert pred({"metadata": {"namespace": "default"}})


def test_patches() -> None:
    doc = {"a": {"b": 1, "c": [1, 2]}, "d": "x"}
    assert patch.merge_patch(doc, {"a": {"b": None, "c": [3]}, "e": 1}) == {
        "a": {"c": [3]},
        "d": "x",
        "e": 1,
    }
    ops = [
        {"op": "add", "path": "/a/c/-", "value": 9},
        {"op": "remove", "path": "/d"},
        {"op": "test", "path": "/a/b", "value": 1},
        {"op": "copy", "from": "/a/b", "path": "/f"},
        {"op": "move", "from": "/f", "path": "/g"},
    ]
    assert patch.json_patch(doc, ops) == {"a": {"b": 1, "c": [1, 2, 9]}, "g": 1}
    with pytest.raises(patch.PatchError):
        patch.json_patch(doc, [{"op": "test", "path": "/d", "value": "y"}])
    with pytest.raises(patch.PatchError):
        patch.json_patch(doc, [{"op": "remove", "path": "/missing"}])
    pod = {"spec": {"containers": [{"name": "a", "image": "1"}, {"name": "b", "image": "2"}]}}
    smp = {
        "spec": {
            "$setElementOrder/containers": [{"name": "a"}, {"name": "b"}],
            "containers": [{"name": "b", "image": "3"}],
        }
    }
    assert patch.strategic_merge_patch(pod, smp) == {
        "spec": {"containers": [{"name": "a", "image": "1"}, {"name": "b", "image": "3"}]}
    }


def test_clusterprofile_schema_rejects_null_conditions() -> None:
    crd = yaml.safe_load(CLUSTERPROFILE_CRD.read_text())
    cp_schema = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    good = {"spec": {"clusterManager": {"name": "m"}}, "status": {"conditions": []}}
    assert schema.validate(good, cp_schema) == []
    errors = schema.validate({**good, "status": {"conditions": None}}, cp_schema)
    assert [str(e) for e in errors] == [
        'status.conditions: Invalid value: "null": '
        'status.conditions in body must be of type array: "null"'
    ]
    errors = schema.validate(
        {
            "status": {
                "conditions": [
                    {
                        "type": "A",
                        "status": "Maybe",
                        "reason": "r",
                        "message": "",
                        "lastTransitionTime": "t",
                    }
                ]
            }
        },
        cp_schema,
    )
    assert {e.field for e in errors} == {"spec", "status.conditions[0].status"}
    pruned = schema.prune(
        {"spec": {"clusterManager": {"name": "m", "zzz": 1}, "zzz": 2}, "metadata": {"name": "x"}},
        cp_schema,
    )
    assert pruned == {"spec": {"clusterManager": {"name": "m"}}, "metadata": {"name": "x"}}


def test_protobuf_configmap_decodes_like_json() -> None:
    def field(number: int, payload: bytes) -> bytes:
        return bytes([number << 3 | 2, len(payload)]) + payload

    meta = field(1, b"cfg") + field(3, b"default")
    entry = field(1, b"k") + field(2, b"v")
    raw = field(1, meta) + field(2, entry)
    envelope = protobuf.MAGIC + field(1, field(1, b"v1") + field(2, b"ConfigMap")) + field(2, raw)
    assert protobuf.decode(envelope) == {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": "cfg", "namespace": "default"},
        "data": {"k": "v"},
    }
    with pytest.raises(protobuf.UnsupportedKind):
        protobuf.decode(protobuf.MAGIC + field(1, field(1, b"apps/v1") + field(2, b"Deployment")))


def test_tokens_and_token_file() -> None:
    users = parse_token_file('# comment\nt1,alice,uid-1,"g1,g2"\nt2,bob\n')
    assert users == [StaticUser("t1", "alice", "uid-1", ("g1", "g2")), StaticUser("t2", "bob")]
    accounts = {("ns", "sa"): "sa-uid"}
    authn = Authenticator(lambda ns, name: accounts.get((ns, name)))
    authn.add_static(users)
    user, auds = authn.authenticate("t1")
    assert user.groups == ("g1", "g2", "system:authenticated")
    token, exp = authn.mint("ns", "sa", "sa-uid", ["aud1"], 600)
    claims = token_claims(token)
    assert claims["sub"] == "system:serviceaccount:ns:sa" and claims["aud"] == ["aud1"]
    assert abs(exp - time.time() - 600) < 5
    user, auds = authn.authenticate(token, ["aud1", "aud2"])
    assert (user.name, user.uid, auds) == ("system:serviceaccount:ns:sa", "sa-uid", ["aud1"])
    with pytest.raises(AuthenticationFailed):
        authn.authenticate(token)  # not valid for the API audience
    head, body, _sig = token.split(".")
    with pytest.raises(AuthenticationFailed):
        authn.authenticate(f"{head}.{body}.AAAA", ["aud1"])
    accounts.clear()
    with pytest.raises(AuthenticationFailed, match="invalidated"):
        authn.authenticate(token, ["aud1"])


def test_impersonation_unit() -> None:
    admin = UserInfo("admin", groups=("system:masters",))
    allow_all = lambda attrs: (True, "")  # noqa: E731
    assert impersonate(admin, [("Accept", "x")], allow_all) is None
    sa = impersonate(admin, [("impersonate-user", "system:serviceaccount:a:b")], allow_all)
    assert sa == UserInfo(
        "system:serviceaccount:a:b",
        "",
        ("system:serviceaccounts", "system:serviceaccounts:a", "system:authenticated"),
    )
    anon = impersonate(admin, [("Impersonate-User", "system:anonymous")], allow_all)
    assert anon is not None and anon.groups == ("system:unauthenticated",)
    with pytest.raises(StatusError) as refused:  # 400, as kube-apiserver 1.36 answers it
        impersonate(admin, [("Impersonate-Uid", "1")], allow_all)
    assert refused.value.code == 400 and refused.value.message == (
        'requested &user.DefaultInfo{Name:"", UID:"1", Groups:[]string(nil), '
        "Extra:map[string][]string(nil)} without impersonating a user name")
    seen = []
    impersonate(
        admin,
        [("Impersonate-User", "u"), ("Impersonate-Extra-A%2Fb", "v")],
        lambda attrs: (seen.append(attrs) or True, ""),
    )
    assert [(a.resource, a.subresource, a.api_group, a.name) for a in seen] == [
        ("users", "", "", "u"),
        ("userextras", "a/b", "authentication.k8s.io", "v"),
    ]


@pytest.mark.parametrize(
    ("method", "path", "query", "expected"),
    [
        ("GET", "/api/v1/namespaces/ns/pods/p/log", {}, ("get", "ns", "pods", "p", "log")),
        ("GET", "/api/v1/namespaces/ns/pods", {"watch": "1"}, ("watch", "ns", "pods", "", "")),
        ("GET", "/api/v1/namespaces/ns", {}, ("get", "ns", "namespaces", "ns", "")),
        ("PUT", "/api/v1/namespaces/ns/status", {}, ("update", "ns", "namespaces", "ns", "status")),
        ("DELETE", "/apis/g.io/v1/things", {}, ("deletecollection", "", "things", "", "")),
        ("POST", "/api/v1/namespaces/ns/pods/p/exec", {}, ("create", "ns", "pods", "p", "exec")),
    ],
)
def test_request_info(
    method: str, path: str, query: dict[str, str], expected: tuple[str, ...]
) -> None:
    info = requestinfo.parse(method, path, query)
    assert info.resource_request
    assert (info.verb, info.namespace, info.resource, info.name, info.subresource) == expected


def test_non_resource_request_info() -> None:
    for path in ("/healthz", "/api", "/apis/g.io/v1", "/openapi/v3"):
        assert not requestinfo.parse("GET", path, {}).resource_request
