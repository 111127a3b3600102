"""Agent-certificate metrics: handshake failures by reason, rendered in the Prometheus text
format and merged across --workers parts (expiry is in test_metrics.py: the earliest agent
certificate, and per cluster only with --cluster-metrics detailed)."""

from __future__ import annotations

from gateway.ops.metrics import GatewayMetrics, render_parts


def test_certificate_metrics_render_and_merge_across_workers() -> None:
    worker0 = GatewayMetrics()
    worker0.handshake_failures = lambda: {"expired": 3, "unknown_ca": 1}
    worker1 = GatewayMetrics()
    worker1.handshake_failures = lambda: {"expired": 2, "wrong_name": 1}
    worker0.peers = lambda: [worker1.snapshot()]
    text = worker0.render().decode()
    assert 'hubproxy_tunnel_handshake_failures_total{reason="expired"} 5' in text
    assert 'hubproxy_tunnel_handshake_failures_total{reason="unknown_ca"} 1' in text
    assert 'hubproxy_tunnel_handshake_failures_total{reason="wrong_name"} 1' in text
    assert "# TYPE hubproxy_tunnel_handshake_failures_total counter" in text


def test_parts_without_certificate_fields_still_render() -> None:
    from gateway.hub.fleet import tunnel_stats

    text = b"".join(render_parts([{"scalars": {}, "requests": {"c1": [0, 1, 0, 0, 0]}}], {},
                                 tunnel_stats)).decode()
    assert "hubproxy_tunnel_handshake_failures_total{" not in text
    assert 'hubproxy_requests_total{cluster="c1",code="2xx"} 1' in text
