"""Request classes from the target alone: what the response-header timeout exempts and how
latency histograms are split."""

from __future__ import annotations

import pytest

from gateway.wire.requestclass import SHORT, STREAM, WATCH, front_door_class, request_class


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
