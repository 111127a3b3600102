"""The pure part of instance discovery: what a Lease says and which instances are live."""

from __future__ import annotations

import datetime

from gateway.hub.instances import leases

NOW = datetime.datetime(2026, 11, 24, 12, 0, 0, tzinfo=datetime.UTC)


def lease(instance: int, clusters: list[str], age: float, duration: int = 15) -> dict:
    return leases.lease_body(instance, "pod/x", duration, clusters,
                             NOW - datetime.timedelta(seconds=age))


def test_live_instances_ignore_expired_leases_and_foreign_ones() -> None:
    fresh = lease(7, ["b", "a"], age=14)
    expired = lease(8, ["c"], age=16)
    foreign = {"metadata": {"labels": {leases.INSTANCE_LABEL: "not-a-number"}},
               "spec": {"leaseDurationSeconds": 15, "renewTime": leases.micro_time(NOW)}}
    zero = lease(9, [], age=0)
    zero["metadata"]["labels"][leases.INSTANCE_LABEL] = "0"
    live = leases.live_instances([fresh, expired, foreign, zero], NOW)
    assert live == {7: leases.LiveInstance(7, frozenset({"a", "b"}))}
    assert fresh["metadata"]["name"] == "hubproxy-gateway-00000007"
    assert fresh["metadata"]["annotations"][leases.CLUSTERS_ANNOTATION] == "a,b"


def test_missing_clusters_are_those_other_live_instances_serve() -> None:
    live = leases.live_instances([lease(1, ["c1", "c2"], 0), lease(2, ["c3"], 0),
                                  lease(3, ["c4"], 0)], NOW)
    assert leases.missing_clusters({"c1", "c4"}, live, instance=3) == {"c2", "c3"}
    # Its own Lease does not count, and an instance that publishes no list asks for nothing.
    assert leases.missing_clusters(set(), {3: leases.LiveInstance(3, frozenset({"c4"})),
                                           4: leases.LiveInstance(4, None)}, 3) == set()


def test_a_long_cluster_list_is_compressed_and_read_back() -> None:
    """20,000 names are 280 KB of text, past the annotation cap: compressed they fit."""
    many = [f"cluster-{i:06d}" for i in range(20000)]
    body = lease(1, many, 0)
    annotations = body["metadata"]["annotations"]
    assert leases.CLUSTERS_ANNOTATION not in annotations
    assert len(annotations[leases.COMPRESSED_CLUSTERS_ANNOTATION]) <= leases.MAX_CLUSTERS_TEXT
    assert leases.live_instances([body], NOW)[1].clusters == frozenset(many)


def test_a_cluster_list_too_large_even_compressed_is_left_out() -> None:
    import secrets

    many = [secrets.token_hex(16) for _ in range(20000)]  # random: ~25 bytes each compressed
    body = lease(1, many, 0)
    assert body["metadata"]["annotations"] == {}
    assert leases.live_instances([body], NOW)[1].clusters is None


def test_a_compressed_list_that_does_not_decode_or_inflates_too_far_names_nothing() -> None:
    import base64
    import zlib

    bomb = base64.b64encode(zlib.compress(b"a" * (leases.MAX_INFLATED + 1), 9)).decode()
    for packed in ("not base64!", base64.b64encode(b"not zlib").decode(), bomb):
        assert leases.published_clusters({leases.COMPRESSED_CLUSTERS_ANNOTATION: packed}) \
            is None
