"""The per-identity cap on long-running requests (which requests are long-running:
tests/gateway/wire/test_requestclass.py)."""

from __future__ import annotations

import pytest

from gateway.hub.admission.streams import StreamQuota, TooManyStreams


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
