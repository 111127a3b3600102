"""Workers' metrics summed at worker 0: parts merged when rendered, and the datagram link over
real sockets sending only what changed."""

from __future__ import annotations

import asyncio
import logging
import secrets
import socket

import pytest

from gateway.hub.fleet import tunnel_stats
from gateway.ops.metrics import GatewayMetrics
from gateway.ops.metricslink import SWEEP_PERIOD, MetricsLink, PeerSnapshots, SnapshotSender
from tests.support import eventually


def worker_metrics(fleet: dict | None = None) -> GatewayMetrics:
    m = GatewayMetrics()
    m.client_connections = lambda: 2
    m.auth_reviews = lambda: 1
    m.fleet = lambda: fleet or {}
    m.fleet_stats = tunnel_stats
    return m


def entry(worker: int, instance: str = "aaaa0001") -> dict:
    return {"sessions": [{"agent_version": "0.1.0", "agent_instance": instance,
                          "hub_worker": worker, "connected_at": 100.0, "rtt_ms": 1.0,
                          "active_streams": 0, "streams_total": 3, "bytes_in": 10,
                          "bytes_out": 20, "certificate_not_after": 2e9, "draining": False}],
            "last_error": None, "last_error_at": None, "disconnected_at": None}


def test_parts_add_counts_and_count_each_cluster_once() -> None:
    first = worker_metrics({"c1": entry(0), "c2": entry(0)})
    second = worker_metrics({"c2": entry(1), "c3": entry(1)})
    first.request("c1", 200, 10, 100)
    first.request("c1", 200, 1, 1)
    second.request("c1", 200, 5, 50)
    second.request("_other", 404, 0, 0)
    first.stream_opened()
    second.stream_opened()
    second.stream_closed()
    first.auth_lookups, second.auth_lookups = 3, 4
    first.peers = lambda: [second.snapshot()]
    text = first.render().decode()
    assert 'hubproxy_requests_total{cluster="c1",code="2xx"} 3' in text
    assert 'hubproxy_requests_total{cluster="_other",code="4xx"} 1' in text
    assert 'hubproxy_bytes_total{direction="in"} 16' in text
    assert 'hubproxy_bytes_total{direction="out"} 151' in text
    assert "hubproxy_active_streams 1" in text and "hubproxy_streams_total 2" in text
    assert "hubproxy_connected_agents 4" in text  # sessions: one per worker per agent
    assert "hubproxy_connected_clusters 3" in text  # c2 holds a session to both workers
    assert 'hubproxy_tunnel_sessions{cluster="c2"} 2' in text
    assert "hubproxy_client_connections 4" in text
    assert "hubproxy_auth_cache_misses_total 2" in text
    assert "hubproxy_auth_cache_hits_total 5" in text  # 7 lookups, 2 reviews


def test_parts_with_fields_unknown_or_missing_still_render() -> None:
    alone = worker_metrics()
    alone.peers = lambda: [{"scalars": {"bytes_in": 5, "future_field": [1]}},
                           {"future_section": {"x": 1}}, {}]
    text = alone.render().decode()
    assert 'hubproxy_bytes_total{direction="in"} 5' in text
    assert "hubproxy_connected_clusters 0" in text


def _link() -> tuple[PeerSnapshots, SnapshotSender]:
    link = MetricsLink()
    # In one process the two ends come from the same object: take each before closing.
    return PeerSnapshots(link._receive), SnapshotSender(link._send, worker_index=1)


async def test_changes_reach_worker_zero_and_its_copy_renders_like_the_worker() -> None:
    peers, sender = _link()
    fleet = {"c1": entry(1)}
    metrics = worker_metrics(fleet)
    peers.start()
    sender.start(metrics.part, changed=metrics.take_changed, interval=0.02)
    try:
        metrics.request("c1", 200, 0, 0)
        metrics.request("c1", 200, 0, 0)
        await eventually(lambda: peers.snapshots()
                         and peers.snapshots()[0].get("requests", {}).get("c1") ==
                         [0, 2, 0, 0, 0])
        assert len(peers.snapshots()) == 1  # one part per worker, updated in place
        worker0 = worker_metrics()
        worker0.peers = peers.snapshots
        await eventually(lambda: 'hubproxy_tunnel_sessions{cluster="c1"} 1'
                         in worker0.render().decode())
        # A session leaves: its cluster's entry changes and is sent again.
        fleet["c1"] = {**entry(1), "sessions": [], "disconnected_at": 5.0}
        metrics.mark_changed("c1")
        await eventually(lambda: 'hubproxy_connected_clusters 0' in worker0.render().decode())
        # A cluster the worker forgot is removed at worker 0 too (null).
        del fleet["c1"]
        metrics.mark_changed("c1")
        await eventually(lambda: "c1" not in peers.snapshots()[0].get("fleet", {}))
        assert peers.by_worker()[1]["client_connections"] == 2
    finally:
        sender.stop()
        peers.stop()


async def test_only_what_changed_is_sent_at_ten_thousand_clusters() -> None:
    """The first round sends every cluster; then an idle second sends only its sweep slice
    (N / SWEEP_PERIOD clusters compared, none changed: nothing), and traffic on ten clusters
    sends those ten."""
    peers, sender = _link()
    names = [f"cluster-{i:05d}" for i in range(10_000)]
    fleet = {name: entry(1) for name in names}
    metrics = worker_metrics(fleet)
    for name in names:
        metrics.request(name, 200, 1, 1)
    peers.start()
    sender._sock.setblocking(False)
    sender._part, sender._changed = metrics.part, metrics.take_changed
    try:
        first = await sender.send_changes()
        assert first >= 2 * len(names)  # requests and fleet of every cluster
        await eventually(lambda: len(peers.snapshots()[0].get("fleet", {})) == len(names))
        assert await sender.send_changes() == 0  # idle: the sweep finds nothing new
        for name in names[:10]:
            metrics.request(name, 503, 1, 1)
            fleet[name] = {**fleet[name], "last_error": "peer dead", "last_error_at": 7.0}
        # Requests and fleet of ten clusters, and three scalars: codes, bytes in and out.
        assert await sender.send_changes() == 20 + 3
        # An idle session's counters move (pings) without a request: the sweep catches it
        # within SWEEP_PERIOD rounds of a second.
        moved = entry(1)
        moved["sessions"][0]["rtt_ms"] = 3.0
        fleet[names[-1]] = moved
        rounds = 0
        while peers.snapshots()[0]["fleet"][names[-1]]["sessions"][0]["rtt_ms"] != 3.0:
            await sender.send_changes()
            await asyncio.sleep(0)
            rounds += 1
            assert rounds <= SWEEP_PERIOD + 1
        assert peers.snapshots()[0]["requests"][names[0]] == [0, 1, 0, 0, 1]
        assert sender.datagrams < 200 and sender.bytes_sent < 2_000_000
    finally:
        sender.stop()
        peers.stop()


async def test_a_malformed_datagram_is_dropped_and_reading_goes_on(
        caplog: pytest.LogCaptureFixture) -> None:
    receive, send = socket.socketpair(socket.AF_UNIX, socket.SOCK_DGRAM)
    peers = PeerSnapshots(receive)
    peers.start()
    try:
        send.send(b"not json")
        send.send(b'{"worker": 2}')
        send.send(b'{"worker": 3, "changes": {"not": "a list"}}')
        send.send(b'{"worker": 3, "changes": [["scalars", "bytes_in", 7]]}')
        await eventually(peers.snapshots)
        assert peers.by_worker() == {3: {"bytes_in": 7}}
        assert caplog.text.count("dropped a malformed snapshot") == 3
    finally:
        peers.stop()
        send.close()


async def test_a_value_too_big_for_a_datagram_is_said_once_not_raised(
        caplog: pytest.LogCaptureFixture) -> None:
    receive, send = socket.socketpair(socket.AF_UNIX, socket.SOCK_DGRAM)
    send.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 4096)
    sender = SnapshotSender(send, worker_index=1)
    caplog.set_level(logging.WARNING, logger="hubproxy.gateway")
    # Random names: datagrams are compressed, so only incompressible ones outgrow a datagram.
    names = [secrets.token_hex(32) for _ in range(2_000)]
    sender.start(lambda: {"scalars": {"names": names}}, interval=0.01)
    try:
        await asyncio.sleep(0.1)  # several more attempts
        assert caplog.text.count("cannot send a value") == 1
    finally:
        sender.stop()
        receive.close()
