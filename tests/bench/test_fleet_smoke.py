"""``python -m bench fleet --smoke`` end to end: a real kube-apiserver hub with a ClusterProfile and
an OCM add-on per cluster, one gateway with its writers on, 200 agents' sessions in four
processes, load through the front door, and a reconnect storm (SIGKILL, a new gateway on the
same ports).

Not a performance test (no thresholds on speed, memory or CPU: the goals are printed, not
asserted): it checks that the JSON has what bench/README.md documents and that its numbers come
from a run that happened: every cluster connected and came back after the restart, requests
crossed gateway, tunnel and agent and succeeded, the gateway's hub writes were counted on the
hub (one ClusterProfile entry and one add-on condition per cluster), and both objects ended
right for every cluster.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.realkube.binaries import MissingBinaries, find_binaries

CLUSTERS = 200
GOALS = {"clusters_connected", "rss_per_cluster", "idle_cpu", "formed_at_once", "restart",
         "p99_vs_baseline", "hub_writes", "converged", "metrics_scrape"}


def _missing() -> str | None:
    if shutil.which("wrk") is None:
        return "needs wrk: apt-get install -y wrk"
    try:
        find_binaries()
    except MissingBinaries as exc:
        return f"needs the real kube-apiserver tier's binaries: {exc}"
    return None


@pytest.mark.slow
@pytest.mark.timeout(300)
@pytest.mark.skipif(_missing() is not None, reason=_missing() or "")
def test_smoke_run_connects_every_agent_survives_a_restart_and_counts_hub_writes(
        tmp_path: Path) -> None:
    out = tmp_path / "fleet.json"
    proc = subprocess.run(
        [sys.executable, "-m", "bench", "fleet", "--smoke", "--json", str(out)],
        capture_output=True, text=True, timeout=280, start_new_session=True,
        cwd=Path(__file__).resolve().parents[2])
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    report = json.loads(out.read_text())
    assert report["mode"] == "smoke" and len(report["runs"]) == 1
    run = report["runs"][0]
    assert run["clusters"] == CLUSTERS and set(run["goals"]) == GOALS

    # Every agent connected, through the real dialer: one accepted dial each at least.
    assert run["connect"]["connected"] == CLUSTERS and run["all_connected_s"] is not None
    assert run["connect"]["agent_dials"]["dials"] >= CLUSTERS
    assert run["gateway_connected_clusters"] == CLUSTERS  # the gateway's own gauge agrees
    assert run["gateway_rss_mib"] > run["gateway_rss_before_mib"] > 0
    assert run["metrics"]["status"] == 200 and run["metrics"]["bytes"] > 0

    # Requests crossed gateway -> tunnel -> agent -> upstream and succeeded.
    closed = run["closed_loop"]
    assert closed["ok"] > 0 and closed["statuses"].get("200") == closed["ok"]
    steady = run["steady"]["connected"]
    assert steady["ok"] > 0 and steady["failed"] == 0, steady

    # The storm happened: every agent lost its session to the killed gateway and came back.
    storm = run["storm"]
    ended = sum(run["sessions_ended_by_agents_reason"].values())
    assert ended >= CLUSTERS, run["sessions_ended_by_agents_reason"]
    assert storm["connected"] == CLUSTERS and storm["all_back_s"] is not None
    assert storm["agent_dials"]["dials"] >= CLUSTERS
    assert storm["requests_to_clusters_back"]["ok"] > 0

    # Hub writes counted on the hub (its audit log): one entry and one condition per cluster.
    writes = run["hub_start"]["writes_by_resource"]
    assert writes.get("patch clusterprofiles/status", 0) >= CLUSTERS, writes
    assert writes.get("patch managedclusteraddons/status", 0) >= CLUSTERS, writes
    assert run["hub_storm"]["writes"] > 0
    for phase in ("converge_start", "converge_storm"):
        assert run[phase]["last"] == {"profiles": CLUSTERS, "addons": CLUSTERS}, run[phase]

    assert "back after restart" in proc.stdout and "restart:" in proc.stdout
