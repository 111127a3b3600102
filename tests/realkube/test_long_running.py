"""The long-running table of ``gateway.wire.requestclass`` against the real kube-apiserver
(issue 25): every row of ``tests/gateway/wire/test_requestclass.py`` but the destructive one is
sent to the managed apiserver, and the predicate must call it what the server made of it: a
watch (its audit verb), a follow (the query it sent the pod's kubelet) or neither; and
``gateway.wire.requestinfo``, which both the predicate and the gateway's own Kubernetes audit
events read requests with, must give each the verb the server's audit event gave it."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from gateway.wire.requestclass import SHORT, STREAM, WATCH, request_class
from gateway.wire.requestinfo import request_info
from tests.gateway.wire.test_requestclass import KUBE_APISERVER_TABLE, LOG
from tests.realkube import longrunning
from tests.realkube.conftest import Kube


@pytest.fixture(scope="module")
def kubelet(kube: Kube) -> Iterator[longrunning.FakeKubelet]:
    fake = longrunning.FakeKubelet()
    try:
        longrunning.set_up(kube.managed, fake)
        yield fake
    finally:
        longrunning.tear_down(kube.managed)
        fake.close()


def kube_apiserver_class(kube: Kube, kubelet: longrunning.FakeKubelet, method: str,
                         target: str) -> tuple[str, longrunning.Observation]:
    sent = len(kubelet.targets)
    seen = longrunning.observe(kube.managed, method, target)
    followed = any("follow=true" in t for t in kubelet.targets[sent:])
    return (WATCH if seen.verb == "watch" else STREAM if followed else SHORT), seen


def test_the_predicate_agrees_with_the_real_kube_apiserver(
        kube: Kube, kubelet: longrunning.FakeKubelet) -> None:
    disagree = []
    for request_line, expected in KUBE_APISERVER_TABLE:
        method, target = request_line.split(" ")
        if method == "DELETE":
            continue  # a deletecollection: it would remove the objects the others need
        if target.startswith(LOG):
            # The kubelet here has a self-signed certificate (no effect on follow's value).
            target += ("&" if "?" in target else "?") + "insecureSkipTLSVerifyBackend=true"
        real, seen = kube_apiserver_class(kube, kubelet, method, target)
        ours = request_class(target.encode(), method=method.encode())
        verb = request_info(method, target).verb
        if not real == ours == expected or verb != seen.verb:
            disagree.append(f"{method} {target}: kube-apiserver {real} ({seen}), "
                            f"predicate {ours}, table {expected}, requestinfo verb {verb}")
    assert not disagree, "\n".join(disagree)


def test_kube_apiserver_holds_every_log_request_as_long_running(
        kube: Kube, kubelet: longrunning.FakeKubelet) -> None:
    """What requestclass's docstring says is a deliberate difference: kube-apiserver's
    LongRunningFunc covers a log without follow too; the gateway calls that one short."""
    for target in (LOG, LOG + "?follow=true"):
        _, seen = kube_apiserver_class(
            kube, kubelet, "GET", target + ("&" if "?" in target else "?")
            + "insecureSkipTLSVerifyBackend=true")
        assert seen.status == 200 and seen.verb == "get" and seen.long_running, seen
    assert request_class(LOG.encode()) == SHORT
    assert request_class((LOG + "?follow=true").encode()) == STREAM
    watch, seen = kube_apiserver_class(kube, kubelet, "GET",
                                       f"/api/v1/namespaces/{longrunning.NAMESPACE}/configmaps"
                                       "?watch=1")
    assert watch == WATCH and seen.long_running
