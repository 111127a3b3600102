"""Workers' metrics summed at worker 0: the pure merge, and the datagram link over real sockets."""

from __future__ import annotations

import asyncio
import json
import logging
import secrets
import socket

import pytest

from gateway.ops.metrics import GatewayMetrics, merge, render
from gateway.ops.metricslink import MetricsLink, PeerSnapshots, SnapshotSender
from tests.support import eventually


def worker_metrics(clusters: set[str], agents: int) -> GatewayMetrics:
    m = GatewayMetrics()
    m.cluster_names = lambda: clusters
    m.connected_agents = lambda: agents
    m.client_connections = lambda: 2
    m.auth_reviews = lambda: 1
    return m


def test_merge_adds_counts_and_counts_each_cluster_once() -> None:
    first, second = worker_metrics({"c1", "c2"}, 2), worker_metrics({"c2", "c3"}, 2)
    first.request("c1", 200, 10, 100)
    first.request("c1", 200, 1, 1)
    second.request("c1", 200, 5, 50)
    second.request("_other", 404, 0, 0)
    first.stream_opened()
    second.stream_opened()
    second.stream_closed()
    first.auth_lookups, second.auth_lookups = 3, 4

    total = merge([first.snapshot(), second.snapshot()])
    assert total["requests"] == {("c1", 200): 3, ("_other", 404): 1}
    assert (total["bytes_in"], total["bytes_out"]) == (16, 151)
    assert total["active_streams"] == 1 and total["streams_total"] == 2
    assert total["connected_agents"] == 4  # sessions: one per worker per agent
    assert total["connected_clusters"] == 3  # c2 holds a session to both workers
    assert total["client_connections"] == 4

    text = render(total).decode()
    assert 'hubproxy_requests_total{cluster="c1",code="200"} 3' in text
    assert "hubproxy_connected_clusters 3" in text
    assert "hubproxy_auth_cache_misses_total 2" in text
    assert "hubproxy_auth_cache_hits_total 5" in text  # 7 lookups, 2 reviews


def test_a_single_process_renders_its_own_figures() -> None:
    alone = worker_metrics({"c1"}, 1)
    alone.request("c1", 201, 1, 2)
    text = alone.render().decode()
    assert 'hubproxy_requests_total{cluster="c1",code="201"} 1' in text
    assert "hubproxy_connected_agents 1" in text


def test_render_adds_the_peers_latest_snapshots() -> None:
    worker0, worker1 = worker_metrics({"c1"}, 1), worker_metrics({"c1"}, 1)
    worker0.request("c1", 200, 0, 0)
    for _ in range(4):
        worker1.request("c1", 200, 0, 0)
    worker0.peers = lambda: [worker1.snapshot()]
    assert 'hubproxy_requests_total{cluster="c1",code="200"} 5' in worker0.render().decode()


def test_merge_ignores_fields_it_does_not_know_and_tolerates_missing_ones() -> None:
    total = merge([{"bytes_in": 5, "future_field": [1]}, {}])
    assert total["bytes_in"] == 5 and total["requests"] == {} and total["connected_clusters"] == 0


async def test_snapshots_reach_worker_zero_and_the_latest_wins() -> None:
    link = MetricsLink()
    # In one process the two ends come from the same object: take each before closing.
    receive, send = link._receive, link._send
    peers, sender = PeerSnapshots(receive), SnapshotSender(send, worker_index=1)
    metrics = worker_metrics({"c1"}, 1)
    peers.start()
    sender.start(metrics.snapshot, interval=0.02)
    try:
        metrics.request("c1", 200, 0, 0)
        metrics.request("c1", 200, 0, 0)
        await eventually(lambda: peers.snapshots()
                         and peers.snapshots()[0]["requests"] == [["c1", 200, 2]])
        assert len(peers.snapshots()) == 1  # one entry per worker, replaced, not appended
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
        send.send(b'{"worker": 3, "metrics": {"bytes_in": 7}}')
        await eventually(peers.snapshots)
        assert peers.snapshots() == [{"bytes_in": 7}]
        assert caplog.text.count("dropped a malformed snapshot") == 2
    finally:
        peers.stop()
        send.close()


async def test_a_snapshot_too_big_for_a_datagram_is_said_once_not_raised(
        caplog: pytest.LogCaptureFixture) -> None:
    receive, send = socket.socketpair(socket.AF_UNIX, socket.SOCK_DGRAM)
    send.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 4096)
    sender = SnapshotSender(send, worker_index=1)
    caplog.set_level(logging.WARNING, logger="hubproxy.gateway")
    # Random names: snapshots are compressed, so only incompressible ones outgrow a datagram.
    names = [secrets.token_hex(32) for _ in range(10_000)]
    sender.start(lambda: {"clusters": names}, interval=0.01)
    try:
        await asyncio.sleep(0.1)  # several more attempts
        assert caplog.text.count("cannot send its snapshot") == 1
    finally:
        sender.stop()
        receive.close()


async def test_a_thousand_clusters_fit_in_one_datagram() -> None:
    """Histograms per cluster and the fleet's sessions: ~600 KB of JSON for a thousand clusters,
    beyond a datagram; compressed it crosses with the default socket buffers."""
    link = MetricsLink()
    peers, sender = PeerSnapshots(link._receive), SnapshotSender(link._send, worker_index=1)
    metrics = GatewayMetrics()
    fleet = {}
    for i in range(1000):
        cluster = f"cluster-{i:04d}"
        for code in (200, 201, 404):
            metrics.request(cluster, code, 10, 100, 0.001 * i, "short")
        metrics.request(cluster, 200, 1, 1, 100.0, "watch")
        fleet[cluster] = {"sessions": [{"agent_version": "0.1.0", "agent_instance": f"{i:08x}",
                                        "hub_worker": 1, "connected_at": 1.7e9 + i,
                                        "rtt_ms": 0.123, "active_streams": 3,
                                        "streams_total": 12345, "bytes_in": 123456789 + i,
                                        "bytes_out": 98765432, "certificate_not_after": 1.8e9,
                                        "draining": False}],
                          "last_error": None, "last_error_at": None, "disconnected_at": None}
    metrics.fleet = lambda: fleet
    assert len(json.dumps(metrics.snapshot())) > 400_000
    peers.start()
    sender.start(metrics.snapshot, interval=0.05)
    try:
        await eventually(lambda: bool(peers.snapshots()), timeout=5)
        [received] = peers.snapshots()
        assert len(received["fleet"]) == 1000 and len(received["latency"]) == 2000
    finally:
        sender.stop()
        peers.stop()
