"""``python -m bench.tunnelidle`` end to end at a small scale: real listener (or bare TLS floor),
agents in a child process with their own certificates, a SIGKILL and restart of the hub.

Not a performance test: it checks that every phase runs through the production code and that
the figures it writes are there and sane.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest


@pytest.mark.slow
@pytest.mark.parametrize("hub", ["listener", "floor"])
def test_a_small_fleet_connects_idles_and_comes_back(tmp_path: Path, hub: str) -> None:
    out = tmp_path / "idle.json"
    proc = subprocess.run(
        [sys.executable, "-m", "bench.tunnelidle", "--clusters", "30", "--hub", hub,
         "--agent-procs", "1", "--idle", "1", "--settle", "0.5", "--storm", "--timeout", "60",
         "--pki", str(tmp_path / "pki"), "--json", str(out)],
        capture_output=True, text=True, timeout=120, start_new_session=True,
        cwd=Path(__file__).resolve().parents[2])
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads(out.read_text())
    assert result["connected"] == result["still_connected"] == 30
    assert result["connect_seconds"] is not None and result["hub_kib_per_session"] > 0
    assert result["hub_idle_cpu_percent"] >= 0 and result["hub_cpu_ms_per_agent"] > 0
    if hub == "listener":  # the floor holds bare connections: nothing to restart
        assert result["storm_connected"] == 30 and result["storm_seconds"] is not None
