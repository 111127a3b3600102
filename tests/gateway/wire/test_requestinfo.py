"""A request's verb and object, read as kube-apiserver reads them (gateway.wire.requestinfo).

The expectations with a ``# seen`` mark are what kube-apiserver v1.36 wrote in its own audit
events for the same requests (verb and objectRef), taken from a real apiserver's log; the
realkube tier compares the two again end to end (tests/realkube/test_kube_audit.py).
"""

from __future__ import annotations

import pytest

from gateway.wire.requestinfo import RequestInfo, request_info


@pytest.mark.parametrize(("method", "target", "expected"), [
    # seen
    ("GET", "/api/v1/namespaces/default/configmaps/nope",
     RequestInfo("get", True, "", "v1", "default", "configmaps", "nope")),
    # seen: a field selector on metadata.name names the object of a list
    ("GET", "/api/v1/namespaces/default/configmaps?fieldSelector=metadata.name%3Dx",
     RequestInfo("list", True, "", "v1", "default", "configmaps", "x")),
    # seen
    ("GET", "/api/v1/namespaces/default/pods?watch=1&timeoutSeconds=1",
     RequestInfo("watch", True, "", "v1", "default", "pods")),
    # seen
    ("DELETE", "/api/v1/namespaces/default/configmaps",
     RequestInfo("deletecollection", True, "", "v1", "default", "configmaps")),
    # seen: a namespace is its own namespace
    ("GET", "/api/v1/namespaces/default",
     RequestInfo("get", True, "", "v1", "default", "namespaces", "default")),
    # seen
    ("GET", "/apis/apps/v1/namespaces/default/deployments/x/status",
     RequestInfo("get", True, "apps", "v1", "default", "deployments", "x", "status")),
    # seen
    ("POST", "/api/v1/namespaces/default/pods/x/exec?command=ls",
     RequestInfo("create", True, "", "v1", "default", "pods", "x", "exec")),
    # seen: the legacy watch path
    ("GET", "/api/v1/watch/namespaces/default/pods?timeoutSeconds=1",
     RequestInfo("watch", True, "", "v1", "default", "pods")),
    # seen: non-resource requests
    ("GET", "/apis", RequestInfo("get")),
    ("GET", "/version", RequestInfo("get")),
    ("POST", "/version", RequestInfo("post")),
    ("GET", "/apis/apps", RequestInfo("get")),
    ("GET", "/apis/apps/v1", RequestInfo("get")),
    ("GET", "/api/v1", RequestInfo("get")),
    ("GET", "/healthz/etcd", RequestInfo("get")),
    # the rest of RequestInfoFactory's rules
    ("GET", "/api/v1/namespaces", RequestInfo("list", True, "", "v1", "", "namespaces")),
    ("PUT", "/api/v1/namespaces/team/finalize",
     RequestInfo("update", True, "", "v1", "team", "namespaces", "team", "finalize")),
    ("PATCH", "/api/v1/namespaces/team/status",
     RequestInfo("patch", True, "", "v1", "team", "namespaces", "team", "status")),
    ("GET", "/api/v1/nodes/n1", RequestInfo("get", True, "", "v1", "", "nodes", "n1")),
    ("GET", "/api/v1/proxy/namespaces/d/pods/p/some/path",
     RequestInfo("proxy", True, "", "v1", "d", "pods", "p")),
    ("GET", "/api/v1/watch/pods", RequestInfo("watch", True, "", "v1", "", "pods")),
    ("GET", "/api/v1/watch", RequestInfo("get")),  # "unable to determine kind": not a resource
    ("GET", "/api/v1/pods?watch=true", RequestInfo("watch", True, "", "v1", "", "pods")),
    ("GET", "/api/v1/pods?watch=", RequestInfo("watch", True, "", "v1", "", "pods")),
    ("GET", "/api/v1/pods?watch=FALSE", RequestInfo("list", True, "", "v1", "", "pods")),
    ("GET", "/api/v1/pods?watch=0&watch=1", RequestInfo("list", True, "", "v1", "", "pods")),
    ("HEAD", "/api/v1/pods", RequestInfo("list", True, "", "v1", "", "pods")),
    ("DELETE", "/api/v1/namespaces/d/pods/p",
     RequestInfo("delete", True, "", "v1", "d", "pods", "p")),
    ("OPTIONS", "/api/v1/pods", RequestInfo("", True, "", "v1", "", "pods")),
    ("GET", "/apis/example.com/v1alpha1/widgets/w%20x",
     RequestInfo("get", True, "example.com", "v1alpha1", "", "widgets", "w x")),
    # the whole path is decoded before it is split (Go's URL.Path): %2F is a separator
    ("GET", "/api/v1/namespaces%2Fd%2Fpods?watch=1",
     RequestInfo("watch", True, "", "v1", "d", "pods")),
    # the Service form the gateway forwards to allow-listed Services
    ("GET", "/api/v1/namespaces/default/services/https:web:8443/proxy-service/x/y",
     RequestInfo("get", True, "", "v1", "default", "services", "https:web:8443",
                 "proxy-service")),
    ("GET", "/api/v1/pods?fieldSelector=metadata.name==a,spec.nodeName=n",
     RequestInfo("list", True, "", "v1", "", "pods", "a")),
    ("GET", "/api/v1/pods?fieldSelector=metadata.name!=a",
     RequestInfo("list", True, "", "v1", "", "pods")),
    ("GET", "/api/v1/pods?fieldSelector=metadata.name%3D..",
     RequestInfo("list", True, "", "v1", "", "pods")),
])
def test_request_info(method: str, target: str, expected: RequestInfo) -> None:
    assert request_info(method, target) == expected
    assert request_info(method.encode(), target.encode()) == expected
