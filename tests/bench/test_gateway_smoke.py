"""``python -m bench gateway --smoke`` end to end: upstream, hubproxy gateway + agent, wrk, curl.

Not a performance test (no thresholds on speed): it checks that the benchmark drives the
production path (a bearer token through the gateway, the tunnel and the agent, with no
errors), writes every documented key, and that the figures are sane.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

RATIO_KEYS = ("large_body_vs_direct", "large_body_vs_nginx", "large_body_vs_kubectl_proxy",
              "small_get_c16_vs_kubectl_proxy", "small_get_c16_vs_nginx", "p50_added_ms_c1",
              "p99_added_ms_c1", "small_get_c16_vs_aiohttp_proxy")


@pytest.mark.slow
@pytest.mark.skipif(shutil.which("wrk") is None, reason="needs wrk: apt-get install -y wrk")
def test_smoke_run_measures_hubproxy_against_direct(tmp_path: Path) -> None:
    out = tmp_path / "gateway.json"
    proc = subprocess.run(
        [sys.executable, "-m", "bench", "gateway", "--smoke", "--json", str(out)],
        capture_output=True, text=True, timeout=240, start_new_session=True,
        cwd=Path(__file__).resolve().parents[2],
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads(out.read_text())
    assert result["mode"] == "smoke" and result["skipped"] == {}

    ratios = result["ratios"]
    assert set(RATIO_KEYS) <= set(ratios)
    # Only direct and hubproxy run in smoke mode: the others are absent, not invented.
    assert ratios["large_body_vs_nginx"] is None
    assert ratios["small_get_c16_vs_kubectl_proxy"] is None
    assert ratios["small_get_c16_vs_aiohttp_proxy"] is None
    assert 0 < ratios["large_body_vs_direct"] < 10
    assert ratios["p50_added_ms_c1"] > 0 and ratios["p99_added_ms_c1"] is not None

    for name in ("direct", "hubproxy"):
        cfg = result["configs"][name]
        for conc in ("c1", "c16"):
            run = cfg["small_get"][conc]
            assert run["rps"] > 0 and run["errors"] == 0, (name, conc, run)
            assert 0 < run["p50_ms"] <= run["p99_ms"]
        assert cfg["large_body"]["mb_s"] > 0 and len(cfg["large_body"]["samples_mb_s"]) == 5
        assert cfg["watch"]["events_per_s"] > 0
    hub = result["configs"]["hubproxy"]
    assert hub["cpu"]["gateway"]["s_per_10k_requests"] > 0
    assert hub["cpu"]["agent"]["s_per_gb"] > 0
    assert hub["peak_rss_mib"]["gateway"] > 0

    idle = result["idle_watches"]
    assert idle["open"] == idle["requested"] == result["plan"]["idle_watches"]
    assert idle["outcomes"] == {"200": idle["requested"]}
    idle_h2 = result["idle_watches_h2"]  # the same watches as streams of one h2 connection
    assert idle_h2["open"] == idle_h2["requested"] == result["plan"]["idle_watches"]
    assert idle_h2["outcomes"] == {"200": idle_h2["requested"]} and idle_h2["protocol"] == "h2"
    if shutil.which("h2load"):  # small GETs over one HTTP/2 connection, 16 streams
        h2 = hub["small_get"]["h2_c1_m16"]
        assert h2["rps"] > 0 and h2["errors"] == 0
        assert result["ratios"]["small_get_h2_m16_vs_h1_c16"] > 0
    floor = result["tls_floor"]
    assert floor["connections"] == idle["requested"] and floor["bytes_per_connection"] > 0
    assert 0 < floor["openssl_bytes_per_connection"] < 1_000_000
    assert result["soak"]["requests"] > 0 and result["soak"]["errors"] == 0
    assert set(result["goals"]) >= {"p50_added_ms_c1", "idle_watches_gateway_rss_10k_mib",
                                    "small_get_c16_vs_aiohttp_proxy"}
    assert result["machine"]["nproc"] >= 1 and result["machine"]["wrk"]
    # The readable table with ratio columns and the PASS/MISS lines go to stdout.
    assert "hub/direct" in proc.stdout and "small GET req/s c16" in proc.stdout
    assert "PASS" in proc.stdout or "MISS" in proc.stdout
