"""Histograms and the new gateway series in the Prometheus text, merged over workers."""

from __future__ import annotations

from gateway.ops.metrics import (
    REQUEST_BUCKETS,
    GatewayMetrics,
    Histogram,
    certificate_lines,
    merge,
    render,
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
    text = render(merge([first.snapshot(), second.snapshot()])).decode()
    assert 'hubproxy_request_duration_seconds_count{cluster="c1",class="short"} 2' in text
    assert 'hubproxy_request_duration_seconds_bucket{cluster="c1",class="watch",le="1800"} 1' \
        in text
    assert 'hubproxy_hub_requests_total{call="tokenreview",outcome="error"} 1' in text
    assert 'hubproxy_hub_request_duration_seconds_count{call="tokenreview"} 2' in text
    assert "hubproxy_authz_cache_hits_total 6" in text  # 7 lookups, 1 SAR
    assert "hubproxy_tunnel_refused_total 2" in text
    assert len(REQUEST_BUCKETS) + 3 == sum(
        1 for line in text.splitlines()
        if line.startswith('hubproxy_request_duration_seconds_') and 'class="short"' in line)


def test_certificates_form_one_family() -> None:
    lines = certificate_lines({"serving": 2e9, "tunnel": 2e9}, {"c1": 1.9e9})
    assert sum(line.startswith("# TYPE") for line in lines) == 1
    assert 'hubproxy_certificate_expiry_timestamp_seconds{certificate="agent",cluster="c1"} ' \
           '1900000000' in lines
    assert certificate_lines({}, {}) == []


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
    text = render(merge([first.snapshot(), second.snapshot()])).decode()
    assert "hubproxy_tunnel_handshakes_in_flight 4" in text
    assert "hubproxy_tunnel_handshakes_total 42" in text
    assert "hubproxy_tunnel_accept_queue 10" in text
    assert 'hubproxy_tunnel_refused_early_total{reason="stale"} 7' in text
    assert 'hubproxy_tunnel_refused_early_total{reason="gone"} 1' in text
    # A gateway without a tunnel listener shows none of these.
    alone = render(merge([GatewayMetrics().snapshot()])).decode()
    assert "hubproxy_tunnel_accept_queue" not in alone
