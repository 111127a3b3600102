"""``python -m bench ha --smoke`` end to end: a real kube-apiserver hub, gateways behind HAProxy,
two agent replicas per kubesim cluster, and every event of the benchmark under load.

Not a performance test (no thresholds on speed or recovery times): it checks that every event
ran with load through the load balancer, that the JSON holds what the README documents, and the
properties issue 13 promises that do not depend on the machine's speed: a rolling replacement,
scaling and an agent's SIGTERM fail no request and interrupt no watch, and during a hub outage a
token the gateways never saw gets 503 with Retry-After at once.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from bench.ha import HAPROXY
from tests.realkube.binaries import MissingBinaries, find_binaries

EVENTS = ("rolling_replacement", "scale_2_4_2", "sigkill", "agent_sigterm", "hub_outage")


def _missing() -> str | None:
    if shutil.which("wrk") is None:
        return "needs wrk: apt-get install -y wrk"
    if not Path(HAPROXY).exists():
        return "needs haproxy: apt-get install -y haproxy"
    try:
        find_binaries()
    except MissingBinaries as exc:
        return f"needs the real kube-apiserver tier's binaries: {exc}"
    return None


@pytest.mark.slow
@pytest.mark.timeout(300)
@pytest.mark.skipif(_missing() is not None, reason=_missing() or "")
def test_smoke_run_drives_every_event_through_the_load_balancer(tmp_path: Path) -> None:
    out = tmp_path / "ha.json"
    proc = subprocess.run(
        [sys.executable, "-m", "bench", "ha", "--smoke", "--json", str(out)],
        capture_output=True, text=True, timeout=280, start_new_session=True,
        cwd=Path(__file__).resolve().parents[2],
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    result = json.loads(out.read_text())
    assert result["mode"] == "smoke" and tuple(result["events"]) == EVENTS
    for name, event in result["events"].items():
        assert event["requests"] > 100 and event["wrk"]["requests"] > 0, (name, event)
        assert event["probes"] > 0, name
        assert event["time_to_steady_s"] is not None, name
        assert event["failed"] == sum(event["failed_by_status"].values()), name
    for name in ("rolling_replacement", "scale_2_4_2", "agent_sigterm"):
        event = result["events"][name]
        assert event["failed"] == 0 and event["watch_interruptions"] == {}, (name, event)
        assert event["watch_clean_ends"] > 0, (name, "watches ended cleanly and re-watched")
    outage = result["events"]["hub_outage"]["notes"]
    fresh = outage["fresh_during_outage"]
    assert set(fresh) == {"503"} and outage["fresh_with_retry_after"] == fresh["503"], outage
    assert outage["fresh_ok_after_hub_back_s"] is not None, "uncached tokens work again"
    assert set(result["goals"]) >= {"rolling_replacement_zero_failures",
                                    "sigkill_full_service_2s", "hub_outage_nothing_hangs"}
    assert "rolling replacement" in proc.stdout and ("PASS" in proc.stdout)
