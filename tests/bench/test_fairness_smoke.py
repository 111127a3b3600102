"""``python -m bench fairness --smoke`` end to end: upstream, kubesim hub, two gateway + agent
pairs (fair queuing on and off), two identities driven by wrk.

Not a performance test (no threshold on the ratio: a loaded machine decides it): it checks that
the benchmark drives the production path with two distinct hub identities, measures both
configurations with no error for the victim, and writes every documented key.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest


@pytest.mark.slow
@pytest.mark.skipif(shutil.which("wrk") is None, reason="needs wrk: apt-get install -y wrk")
def test_smoke_run_measures_a_victim_beside_a_flood(tmp_path: Path) -> None:
    out = tmp_path / "fairness.json"
    proc = subprocess.run(
        [sys.executable, "-m", "bench", "fairness", "--smoke", "--json", str(out)],
        capture_output=True, text=True, timeout=240, start_new_session=True,
        cwd=Path(__file__).resolve().parents[2],
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads(out.read_text())
    assert result["mode"] == "smoke"
    assert result["plan"] == {"seconds": 1.0, "rounds": 1, "flood": 16, "seats": 4}
    assert set(result["configs"]) == {"on", "off"}
    for name, cfg in result["configs"].items():
        assert cfg["victim_errors"] == 0, name  # the victim is never refused nor broken
        assert cfg["flood_other_errors"] == 0, name
        assert 0 < cfg["victim_unloaded_p50_ms"] <= cfg["victim_unloaded_p99_ms"], name
        assert 0 < cfg["victim_loaded_p50_ms"] <= cfg["victim_loaded_p99_ms"], name
        assert cfg["ratio"] == pytest.approx(
            cfg["victim_loaded_p99_ms"] / cfg["victim_unloaded_p99_ms"], abs=0.01)
        assert cfg["flood_rps"] > 0
        [only] = cfg["rounds"]
        assert only["loaded"]["requests"] > 0 and only["flood"]["connections"] == 16
    # Off, nothing is ever refused by fair queuing (16 connections are far below the defaults).
    assert result["configs"]["off"]["flood_refused_429"] == 0
    assert result["configs"]["off"]["gateway_metrics"] == {}  # no fair-queuing figures at all
    # On, 16 connections for 4 seats: the gateway queued the flood (its own counter says so).
    on_metrics = result["configs"]["on"]["gateway_metrics"]
    assert on_metrics["hubproxy_fair_requests_queued_total"] > 0
    assert result["goal"]["ratio_max"] == 2.0 and isinstance(result["goal"]["on_pass"], bool)
    assert result["machine"]["nproc"] >= 1
    assert "unloaded p99" in proc.stdout and ("PASS" in proc.stdout or "MISS" in proc.stdout)
