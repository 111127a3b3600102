"""Which requests are long-running, and the per-identity cap on them."""

from __future__ import annotations

import pytest

from gateway.hub.admission.streams import StreamQuota, TooManyStreams, is_long_running


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


def test_rule7_cap_per_identity_and_cluster_released_once() -> None:
    quota = StreamQuota(max_per_identity=2)
    alice = quota.identity("alice", "token-a")
    slots = [quota.acquire(alice, "c1"), quota.acquire(alice, "c1")]
    with pytest.raises(TooManyStreams) as info:
        quota.acquire(alice, "c1")
    assert info.value.status == 429 and "limit 2" in str(info.value)
    other = [quota.acquire(alice, "c2"), quota.acquire(quota.identity("bob", "t"), "c1")]
    slots[0].release()
    slots[0].release()  # idempotent: the count does not go down twice
    assert quota.open_count(alice, "c1") == 1
    slots.append(quota.acquire(alice, "c1"))
    for slot in slots[1:] + other:
        slot.release()
    assert len(quota) == 0


def test_passthrough_identity_is_a_keyed_hash_never_the_token() -> None:
    quota = StreamQuota()
    key = quota.identity(None, "managed-token-123")
    assert "managed-token-123" not in key and key.startswith("passthrough:")
    assert key == quota.identity("", "managed-token-123")
    assert key != quota.identity(None, "managed-token-124")
    assert StreamQuota().identity(None, "managed-token-123") != key  # per-process key
