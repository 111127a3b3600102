"""``python -m bench tunnel --smoke`` end to end: real hub, real agent, real mTLS on 127.0.0.1.

Not a performance test (no thresholds on speed): it checks that the benchmark runs through the
production code path, writes every documented key, and that the figures are sane.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

KEYS = ("single_stream_ratio", "aggregate_mb_s", "rtt_p50_us", "rtt_p99_us",
        "idle_stream_bytes", "max_streams")


@pytest.mark.slow
def test_smoke_run_writes_sane_json(tmp_path: Path) -> None:
    out = tmp_path / "bench.json"
    proc = subprocess.run(
        [sys.executable, "-m", "bench", "tunnel", "--smoke", "--json", str(out)],
        capture_output=True, text=True, timeout=60, start_new_session=True,
        cwd=Path(__file__).resolve().parents[2],
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads(out.read_text())
    for key in KEYS:
        assert key in result, key
    assert result["single_stream_ratio"] > 0
    assert result["aggregate_mb_s"] > 0
    assert 0 < result["rtt_p50_us"] <= result["rtt_p99_us"]
    assert result["max_streams"] == result["sizes"]["idle_streams"] == 500
    assert 0 < result["idle_stream_bytes"] < 1024 * 1024
    assert result["raw"]["rtt"]["tunnel"]["samples"] == 200
    assert len(result["raw"]["single_mb_s"]["tunnel"]) >= 3
    assert len(result["raw"]["single_mb_s"]["plain"]) >= 3
    assert set(result["goals"]) >= {"single_stream_ratio", "max_streams"}
    assert isinstance(result["machine"]["uvloop"], bool) and result["machine"]["nproc"] >= 1
    # The readable table and the PASS/MISS lines go to stdout.
    assert "single stream MB/s" in proc.stdout
    assert "PASS" in proc.stdout or "MISS" in proc.stdout


def test_dispatcher_rejects_an_unknown_benchmark() -> None:
    proc = subprocess.run([sys.executable, "-m", "bench", "nope"], capture_output=True, text=True,
                          timeout=30, cwd=Path(__file__).resolve().parents[2])
    assert proc.returncode == 2
    assert "tunnel" in proc.stderr
