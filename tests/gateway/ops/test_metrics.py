"""Histograms and the gateway series in the Prometheus text, merged over workers; the series a
cluster adds are bounded, and rendering is a generator of bounded steps."""

from __future__ import annotations

import re
import time

from gateway.hub.fleet import tunnel_stats
from gateway.ops.metrics import (
    BASIC_SERIES_PER_CLUSTER,
    CHUNK,
    REQUEST_BUCKETS,
    GatewayMetrics,
    Histogram,
    render_parts,
)


def test_histogram_buckets_are_cumulative_with_sum_and_count() -> None:
    histogram = Histogram((0.1, 1.0))
    for value in (0.05, 0.1, 0.5, 3.0):
        histogram.observe(value)
    lines = histogram.lines("x_seconds", 'a="b"')
    assert lines == ['x_seconds_bucket{a="b",le="0.1"} 2', 'x_seconds_bucket{a="b",le="1"} 3',
                     'x_seconds_bucket{a="b",le="+Inf"} 4', 'x_seconds_sum{a="b"} 3.650000',
                     'x_seconds_count{a="b"} 4']


def test_a_peer_with_other_buckets_is_ignored_not_misadded() -> None:
    histogram = Histogram((0.1, 1.0))
    histogram.add_json([1, 2, 3, 4, 5.0])  # five buckets: another version's layout
    assert histogram.counts == [0, 0, 0]


def test_workers_latency_hub_calls_and_refusals_add_up() -> None:
    first, second = GatewayMetrics(), GatewayMetrics()
    first.request("c1", 200, 0, 0, 0.02, "short")
    second.request("c1", 200, 0, 0, 0.03, "short")
    second.request("c1", 200, 0, 0, 900.0, "watch")
    first.hub_call("tokenreview", 0.004, ok=True)
    second.hub_call("tokenreview", 2.0, ok=False)
    first.authz_lookups, second.authz_lookups = 5, 2
    second.hub_call("subjectaccessreview", 0.01, ok=True)
    first.tunnel_refused = lambda: 2
    first.peers = lambda: [second.snapshot()]
    text = first.render().decode()
    assert 'hubproxy_request_duration_seconds_count{class="short"} 2' in text
    assert 'hubproxy_request_duration_seconds_bucket{class="watch",le="1800"} 1' in text
    assert 'hubproxy_hub_requests_total{call="tokenreview",outcome="error"} 1' in text
    assert 'hubproxy_hub_request_duration_seconds_count{call="tokenreview"} 2' in text
    assert "hubproxy_authz_cache_hits_total 6" in text  # 7 lookups, 1 SAR
    assert "hubproxy_tunnel_refused_total 2" in text
    assert len(REQUEST_BUCKETS) + 3 == sum(
        1 for line in text.splitlines()
        if line.startswith('hubproxy_request_duration_seconds_') and 'class="short"' in line)
    # Latency per cluster only when asked for.
    assert "hubproxy_cluster_request_duration_seconds_" not in text
    assert 'cluster="c1",class=' not in text


def test_detailed_cluster_metrics_add_per_cluster_latency_of_all_workers() -> None:
    first, second = GatewayMetrics(cluster_detail=True), GatewayMetrics(cluster_detail=True)
    first.request("c1", 200, 0, 0, 0.02, "short")
    second.request("c1", 404, 0, 0, 0.03, "short")
    first.peers = lambda: [second.snapshot()]
    text = first.render().decode()
    assert 'hubproxy_cluster_request_duration_seconds_count{cluster="c1",class="short"} 2' \
        in text
    assert 'hubproxy_request_duration_seconds_count{class="short"} 2' in text


def test_requests_count_by_code_class_per_cluster_and_by_code_overall() -> None:
    one, two = GatewayMetrics(), GatewayMetrics()
    for code in (200, 201, 201, 404, 503, 101):
        one.request("c1", code, 0, 0)
    two.request("c1", 200, 0, 0)
    two.request("_other", 404, 0, 0)
    one.peers = lambda: [two.snapshot()]
    text = one.render().decode()
    for line in ('hubproxy_requests_total{cluster="c1",code="1xx"} 1',
                 'hubproxy_requests_total{cluster="c1",code="2xx"} 4',
                 'hubproxy_requests_total{cluster="c1",code="4xx"} 1',
                 'hubproxy_requests_total{cluster="c1",code="5xx"} 1',
                 'hubproxy_requests_total{cluster="_other",code="4xx"} 1',
                 'hubproxy_requests_by_code_total{code="201"} 2',
                 'hubproxy_requests_by_code_total{code="200"} 2',
                 'hubproxy_requests_by_code_total{code="404"} 2'):
        assert line in text, line
    assert 'code="3xx"' not in text  # classes never seen make no series


def _entry(version: str, not_after: float, worker: int = 0) -> dict:
    return {"sessions": [{"agent_version": version, "agent_instance": f"{worker:08x}",
                          "hub_worker": worker, "connected_at": 1.0, "rtt_ms": 2.0,
                          "active_streams": 1, "streams_total": 3, "bytes_in": 10,
                          "bytes_out": 20, "certificate_not_after": not_after,
                          "draining": False}],
            "last_error": None, "last_error_at": None, "disconnected_at": None,
            "ended_bytes_in": 5, "ended_bytes_out": 5, "ended_streams": 1}


def _cluster_series(text: str, cluster: str) -> list[str]:
    return [line for line in text.splitlines()
            if not line.startswith("#") and f'cluster="{cluster}"' in line]


def test_series_per_cluster_are_bounded_whatever_the_traffic() -> None:
    """Every status code, every request class and two agent versions: the cluster still adds
    at most BASIC_SERIES_PER_CLUSTER series (one more per extra agent version), all counters
    and gauges; detailed adds the histograms and the certificate."""
    fleets = {"c1": _entry("0.1.0", 2e9)}
    other = {"c1": _entry("0.2.0", 2e9 + 1, worker=1)}
    for detail in (False, True):
        one = GatewayMetrics(cluster_detail=detail)
        for code in range(100, 600):
            for kind in ("short", "watch", "stream"):
                one.request("c1", code, 1, 1, 0.01, kind)
        one.fleet = lambda: fleets
        one.fleet_stats = tunnel_stats
        one.peers = lambda: [{"fleet": other}]
        text = one.render().decode()
        series = _cluster_series(text, "c1")
        if not detail:
            assert len(series) == BASIC_SERIES_PER_CLUSTER + 1, series  # two versions
            assert not any("_bucket" in line for line in series)
        else:
            histograms = [s for s in series if "cluster_request_duration" in s]
            assert len(histograms) == 3 * (len(REQUEST_BUCKETS) + 3)
            assert 'hubproxy_certificate_expiry_timestamp_seconds{certificate="agent",' \
                'cluster="c1"} 2000000000' in series
        # Every family has one TYPE line, its samples right after it.
        types = re.findall(r"^# TYPE (\S+)", text, re.M)
        assert len(types) == len(set(types))
        assert 'hubproxy_tunnel_sessions{cluster="c1"} 2' in series
        assert 'hubproxy_tunnel_streams_opened_total{cluster="c1"} 8' in series


def test_agent_certificates_are_summarized_not_listed_per_cluster() -> None:
    now = time.time()
    fleets = {"soon": _entry("0.1.0", now + 3 * 86400), "month": _entry("0.1.0",
                                                                        now + 20 * 86400),
              "later": _entry("0.1.0", now + 90 * 86400)}
    chunks = render_parts([{"fleet": fleets}], {"serving": 2e9, "tunnel": 2e9}, tunnel_stats,
                          now=now)
    text = b"".join(chunks).decode()
    assert f"hubproxy_agent_certificate_earliest_expiry_timestamp_seconds " \
           f"{now + 3 * 86400:.0f}" in text
    assert 'hubproxy_agent_certificates_expiring{within="7d"} 1' in text
    assert 'hubproxy_agent_certificates_expiring{within="30d"} 2' in text
    assert 'hubproxy_certificate_expiry_timestamp_seconds{certificate="serving"} 2000000000' \
        in text
    assert 'certificate="agent"' not in text
    assert sum(line.startswith("# TYPE hubproxy_certificate_expiry") for line in
               text.splitlines()) == 1


def test_rendering_is_bounded_steps() -> None:
    """Each step of the generator handles at most CHUNK clusters of a family: 3 * CHUNK
    clusters take several steps, and no step holds more than CHUNK clusters' lines."""
    one = GatewayMetrics()
    for i in range(3 * CHUNK):
        one.request(f"c{i:04d}", 200, 0, 0)
    steps = [chunk for chunk in one.render_chunks()]
    with_requests = [c for c in steps if b"hubproxy_requests_total{" in c]
    assert len(with_requests) == 3
    assert all(c.count(b"\n") <= CHUNK + 2 for c in with_requests)


def test_fair_queuing_figures_of_workers_add_up_and_are_absent_when_off() -> None:
    from gateway.hub.admission.seats import Seat, Seats

    first, second = Seats(2, queues=1, hand_size=1, queue_length=1), Seats(3)
    held = [first.take("user:a"), first.take("user:a")]
    first._count_refusal("queue_full", "user:a")
    second._count_refusal("timeout", "user:b")
    second.waits.observe(0.02)
    one, two = GatewayMetrics(), GatewayMetrics()
    one.fairness, two.fairness = first.snapshot, second.snapshot
    one.peers = lambda: [two.snapshot()]
    text = one.render().decode()
    assert "hubproxy_fair_seats 5" in text and "hubproxy_fair_seats_in_use 2" in text
    assert 'hubproxy_fair_rejected_total{reason="queue_full"} 1' in text
    assert 'hubproxy_fair_rejected_total{reason="timeout"} 1' in text
    assert 'hubproxy_fair_flow_rejected_total{flow="user:a"} 1' in text
    assert 'hubproxy_fair_flow_rejected_total{flow="user:b"} 1' in text
    assert 'hubproxy_fair_queue_wait_seconds_bucket{le="0.025"} 1' in text
    assert "hubproxy_fair_queue_wait_seconds_count 1" in text
    for seat in held:
        assert isinstance(seat, Seat)
        seat.release()
    assert "hubproxy_fair" not in GatewayMetrics().render().decode()  # off: no family at all


def test_the_tunnel_listeners_admission_adds_up_over_workers() -> None:
    first, second = GatewayMetrics(), GatewayMetrics()
    first.tunnel_admission = lambda: {"handshakes_in_flight": 3, "handshakes_started": 40,
                                      "accept_queue": 10, "refused_stale": 5, "refused_gone": 1}
    second.tunnel_admission = lambda: {"handshakes_in_flight": 1, "handshakes_started": 2,
                                       "accept_queue": 0, "refused_stale": 2, "refused_gone": 0}
    first.peers = lambda: [second.snapshot()]
    text = first.render().decode()
    assert "hubproxy_tunnel_handshakes_in_flight 4" in text
    assert "hubproxy_tunnel_handshakes_total 42" in text
    assert "hubproxy_tunnel_accept_queue 10" in text
    assert 'hubproxy_tunnel_refused_early_total{reason="stale"} 7' in text
    assert 'hubproxy_tunnel_refused_early_total{reason="gone"} 1' in text
    # A gateway without a tunnel listener shows none of these.
    alone = GatewayMetrics().render().decode()
    assert "hubproxy_tunnel_accept_queue" not in alone
