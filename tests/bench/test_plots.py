"""``bench gateway --plot DIR``: PNG charts of a result, configurations side by side."""

from __future__ import annotations

from pathlib import Path

import pytest

pytest.importorskip("matplotlib")

from bench.plots import gateway_charts, tunnel_charts


def _config(rps: float, p99: float) -> dict:
    return {"small_get": {"c1": {"rps": rps / 4, "p50_ms": p99 / 3, "p99_ms": p99},
                          "c16": {"rps": rps, "p50_ms": 1.0, "p99_ms": 2.0}},
            "large_body": {"mb_s": rps / 10},
            "cpu": {"total": {"s_per_10k_requests": 1.5}}}


def test_charts_are_pngs_with_every_configuration(tmp_path: Path) -> None:
    result = {"mode": "quick", "machine": {"nproc": 2},
              "configs": {"direct": _config(20000, 0.5), "hubproxy": _config(9000, 1.2),
                          "kubectl-proxy": _config(4000, 2.0), "custom": _config(1, 9)}}
    written = gateway_charts(result, tmp_path / "charts")
    assert [p.name for p in written] == ["small_get_rps.png", "small_get_latency.png",
                                         "large_body.png", "cpu.png"]
    for path in written:
        data = path.read_bytes()
        assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 5000


def test_a_result_without_small_gets_still_plots_what_it_has(tmp_path: Path) -> None:
    result = {"configs": {"hubproxy": {"large_body": {"mb_s": 100.0}}}}
    written = gateway_charts(result, tmp_path)
    assert [p.name for p in written] == ["large_body.png", "cpu.png"]


def test_tunnel_charts_put_the_tunnel_beside_plain_tls(tmp_path: Path) -> None:
    result = {"mode": "smoke", "single_mb_s_tunnel": 600.0, "single_mb_s_plain": 700.0,
              "aggregate_mb_s": 240.0, "aggregate_mb_s_plain": 250.0, "rtt_p50_us": 47.0,
              "rtt_p50_added_us": 19.0, "rtt_p99_us": 92.0, "rtt_p99_added_us": 10.0}
    written = tunnel_charts(result, tmp_path)
    assert [p.name for p in written] == ["tunnel_throughput.png", "tunnel_rtt.png"]
    for path in written:
        data = path.read_bytes()
        assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 5000
