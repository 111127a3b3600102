"""``--workers N``: worker 0 serves ``/readyz`` for the whole pod, so it is Ready only when
every worker is (issue 13: the kernel spreads connections over all workers, and a worker whose
agents have not reached it yet would answer 503 "cluster not connected")."""

from __future__ import annotations

from typing import Any

from gateway.hub.workers import NOT_READY, readiness_gate


def test_ready_only_once_every_other_worker_reported_ready() -> None:
    latest: dict[int, dict[str, Any]] = {}
    gate = readiness_gate(lambda: latest, workers=3)
    assert gate() == "worker 1 has not reported yet"
    latest[1] = {NOT_READY: None}
    assert gate() == "worker 2 has not reported yet"
    latest[2] = {NOT_READY: "waiting for agents of 1 cluster(s) other instances serve (c1)"}
    assert gate() == "worker 2: waiting for agents of 1 cluster(s) other instances serve (c1)"
    latest[2] = {NOT_READY: None}
    assert gate() is None
    latest[1] = {NOT_READY: "shutting down"}
    assert gate() == "worker 1: shutting down"


def test_one_worker_has_no_other_workers_to_wait_for() -> None:
    assert readiness_gate(lambda: {}, workers=1)() is None
