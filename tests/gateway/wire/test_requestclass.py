"""Request classes from the target alone: what the response-header timeout exempts and how
latency histograms are split."""

from __future__ import annotations

import pytest

from gateway.wire.requestclass import (
    SHORT,
    STREAM,
    WATCH,
    front_door_class,
    is_long_running,
    request_class,
)


@pytest.mark.parametrize(("target", "expected"), [
    (b"/api/v1/pods", SHORT),
    (b"/api/v1/pods?watch=1", WATCH),
    (b"/api/v1/pods?labelSelector=a&watch=true", WATCH),
    (b"/api/v1/pods?watch=TRUE", WATCH),
    (b"/api/v1/pods?watch=0", SHORT),
    (b"/api/v1/pods?watch=false&watch=true", SHORT),  # the first wins, as in kube-apiserver
    (b"/api/v1/pods?swatch=1", SHORT),
    (b"/api/v1/watch/namespaces/default/pods", WATCH),
    (b"/apis/apps/v1/watch/deployments", WATCH),
    (b"/api/v1/namespaces/watch/pods", SHORT),  # a namespace named "watch"
    (b"/apis/watch/v1/things", SHORT),  # a group named "watch"
    (b"/api/v1/namespaces/default/pods/demo/log?follow=true", STREAM),
    (b"/api/v1/namespaces/default/pods/demo/log?follow=1&tailLines=3", STREAM),
    (b"/api/v1/namespaces/default/pods/demo/log?follow=false", SHORT),
    (b"/version", SHORT),
])
def test_request_class(target: bytes, expected: str) -> None:
    assert request_class(target) == expected


def test_upgrades_are_streams_and_the_cluster_prefix_is_skipped() -> None:
    assert request_class(b"/api/v1/namespaces/d/pods/p/exec?command=ls", upgrade=True) == STREAM
    assert front_door_class(b"/c1/api/v1/watch/pods") == WATCH
    assert front_door_class(b"/watch/api/v1/pods") == SHORT  # a cluster named "watch"
    assert front_door_class(b"/c1") == SHORT


# What kube-apiserver v1.36 did with each request: watch / follow / neither. The predicate must
# agree. tests/realkube/test_long_running.py sends every row but the DELETE to the real server,
# where these objects exist (a ConfigMap, a pod whose node's kubelet is a fake that records
# what kube-apiserver asks it), and checks it still does.
NAMESPACE, CONFIGMAP, POD = "longrunning", "present", "logs"
COLLECTION = f"/api/v1/namespaces/{NAMESPACE}/configmaps"
LOG = f"/api/v1/namespaces/{NAMESPACE}/pods/{POD}/log"
KUBE_APISERVER_TABLE = [
    *((f"GET {COLLECTION}?watch={v}", WATCH) for v in (
        "1", "t", "T", "true", "True", "TRUE", "tRuE", "yes", "y", "on", "2", "f", "F", "no",
        "00", "", "false+", "+false", "%20", "%74rue")),
    (f"GET {COLLECTION}?watch", WATCH),
    *((f"GET {COLLECTION}?watch={v}", SHORT) for v in (
        "0", "false", "FALSE", "False", "fals%65", "fal%C5%BFe")),
    (f"GET {COLLECTION}", SHORT),
    (f"GET {COLLECTION}?watch=false&watch=true", SHORT),
    (f"GET {COLLECTION}?watch=true&watch=false", WATCH),
    (f"GET {COLLECTION}?watch=0&watch=1", SHORT),
    (f"GET {COLLECTION}?watch=1&watch=0", WATCH),
    (f"GET {COLLECTION}?WATCH=true", SHORT),
    (f"GET {COLLECTION}?Watch=true", SHORT),
    (f"GET {COLLECTION}?wat%63h=true", WATCH),
    (f"GET {COLLECTION}?watch=true;x=1", SHORT),
    (f"GET {COLLECTION}?x=1;watch=true", SHORT),
    (f"GET {COLLECTION}?watch=%zz", SHORT),
    (f"GET {COLLECTION}?watch=%zz&watch=true", WATCH),
    (f"GET {COLLECTION}?watch=false;&watch=true", WATCH),
    (f"GET {COLLECTION}?limit=abc&watch=true", WATCH),
    (f"GET {COLLECTION}?fieldSelector=metadata.name%3Dx&watch=true", WATCH),
    (f"HEAD {COLLECTION}?watch=true", WATCH),
    (f"POST {COLLECTION}?watch=true", SHORT),
    (f"DELETE {COLLECTION}?watch=true", SHORT),
    (f"GET {COLLECTION}/{CONFIGMAP}?watch=true", SHORT),
    ("GET /api/v1/namespaces?watch=1", WATCH),
    (f"GET /api/v1/namespaces/{NAMESPACE}?watch=1", SHORT),
    (f"GET /api/v1/namespaces/{NAMESPACE}/pods/{POD}/status?watch=1", SHORT),
    (f"GET /api/v1/watch/namespaces/{NAMESPACE}/configmaps", WATCH),
    (f"GET /api/v1/watch/namespaces/{NAMESPACE}/configmaps?watch=false", WATCH),
    (f"GET /api/v1/watch/namespaces/{NAMESPACE}/configmaps/{CONFIGMAP}", WATCH),
    ("GET /api/v1/watch/configmaps", WATCH),
    (f"POST /api/v1/watch/namespaces/{NAMESPACE}/configmaps", WATCH),
    (f"GET /api/v1/watch/namespaces/{NAMESPACE}/pods/{POD}/status", WATCH),
    ("GET /api/v1/w%61tch/configmaps", WATCH),
    (f"GET /api/v1/namespaces/{NAMESPACE}/configm%61ps?watch=1", WATCH),
    (f"GET /apis/apps/v1/namespaces/{NAMESPACE}/deployments?watch=1", WATCH),
    ("GET /apis/apps/v1/watch/deployments", WATCH),
    ("GET /api/v1?watch=1", SHORT),
    ("GET /apis/apps/v1?watch=1", SHORT),
    ("GET /version?watch=1", SHORT),
    (f"GET {LOG}", SHORT),
    *((f"GET {LOG}?follow={v}", STREAM) for v in ("true", "1", "t", "True", "TRUE", "yes", "")),
    (f"GET {LOG}?follow", STREAM),
    *((f"GET {LOG}?follow={v}", SHORT) for v in ("0", "false", "FALSE", "fals%65")),
    (f"GET {LOG}?follow=false&follow=true", SHORT),
    (f"GET {LOG}?follow=true&follow=false", STREAM),
    (f"GET {LOG}?fol%6cow=true", STREAM),
    (f"GET {LOG}?watch=true", SHORT),
    (f"GET {COLLECTION}/{CONFIGMAP}?follow=true", SHORT),
    (f"GET {COLLECTION}?follow=true", SHORT),
]


@pytest.mark.parametrize(("request_line", "expected"), KUBE_APISERVER_TABLE)
def test_the_predicate_agrees_with_kube_apiserver(request_line: str, expected: str) -> None:
    method, target = request_line.split(" ")
    assert request_class(target.encode(), method=method.encode()) == expected
    # The same through the front door's /<cluster> prefix, and as a bool.
    assert front_door_class(b"/c1" + target.encode(), method=method.encode()) == expected
    assert is_long_running(target.encode(), method=method.encode()) is (expected != SHORT)


def test_the_service_form_is_long_running_only_when_upgraded() -> None:
    """The gateway's own Service path names an object: its query is the application's."""
    service = b"/c1/api/v1/namespaces/ns/services/web:80/proxy-service/x?watch=1&follow=1"
    assert front_door_class(service) == SHORT
    assert front_door_class(service, upgrade=True) == STREAM


# Moved from tests/gateway/hub/admission/test_streams.py with the predicate they test.
@pytest.mark.parametrize(
    ("target", "upgrade", "expected"),
    [
        (b"/api/v1/pods?watch=true", False, True),
        (b"/api/v1/pods?labelSelector=a&watch=1&resourceVersion=5", False, True),
        (b"/api/v1/namespaces/d/pods/p/log?follow=true&container=c", False, True),
        (b"/apis/apps/v1/deployments?watch=True", False, True),
        (b"/api/v1/watch/namespaces/d/pods", False, True),
        (b"/apis/apps/v1/watch/deployments", False, True),
        (b"/api/v1/namespaces/d/pods/p/exec?command=sh", True, True),
        (b"/api/v1/pods?watch=false", False, False),
        (b"/api/v1/pods?watch=0", False, False),
        (b"/api/v1/pods?allowWatchBookmarks=true", False, False),
        (b"/api/v1/namespaces/d/pods/p/log", False, False),
        (b"/api/v1/namespaces/watch/pods", False, False),
        (b"/apis/watch/v1/things", False, False),
        (b"/api/v1/pods", False, False),
    ],
)
def test_long_running_requests(target: bytes, upgrade: bool, expected: bool) -> None:
    assert is_long_running(target, upgrade) is expected
