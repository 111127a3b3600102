"""``hubproxy gateway --workers N``: N gateway processes sharing the front door and tunnel ports.

One Python process uses one core. With ``--workers N`` the parent forks N workers before any
event loop exists; each binds the front door and tunnel ports with ``SO_REUSEPORT`` and the
kernel spreads new connections over them. A request can only cross through a session its own
worker holds, so every worker announces itself in the tunnel's SETTINGS (a random instance id
and the count N) and agents keep one session to each (``tunnel.dialer.HubFanout``); the same
mechanism serves several hub replicas behind one address.

Worker 0 also serves ``/healthz``, ``/readyz`` and ``/metrics`` and writes ClusterProfiles; the
other workers send it their figures every second (``gateway.ops.metricslink``), so ``/metrics``
shows the whole gateway. The parent forwards SIGTERM/SIGINT to the workers and waits for them;
if one dies on its own, the others are stopped and the parent exits 1, so the pod restarts as a
whole.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import os
import secrets
import signal
from collections.abc import Callable
from types import FrameType
from typing import Any

from gateway.hub.config import GatewayConfig
from gateway.ops.metricslink import MetricsLink

log = logging.getLogger("hubproxy.gateway")


def instance_id() -> int:
    return secrets.randbits(32) or 1  # 0 means "a single process" on the wire


def distinct_instance_ids(count: int) -> tuple[int, ...]:
    """One instance id per worker, no two alike (agents hold one session per id)."""
    ids: dict[int, None] = {}
    while len(ids) < count:
        ids[instance_id()] = None
    return tuple(ids)


STOP_SIGNALS = frozenset({signal.SIGTERM, signal.SIGINT})

# What a worker adds to the snapshot it sends worker 0: why it is not ready, or None.
NOT_READY = "not_ready"


def readiness_gate(latest: Callable[[], dict[int, dict[str, Any]]], workers: int
                   ) -> Callable[[], str | None]:
    """Worker 0's readiness gate over the other workers: ``/readyz`` (served by worker 0 only)
    stays 503 until every worker has reported and none says it is not ready. The kernel spreads
    the pod's connections over all workers, so one whose agents have not reached it yet (the
    instance readiness gate, per worker) would answer 503 "cluster not connected" to requests
    the Service sends to a pod that looks Ready."""

    def reason() -> str | None:
        reported = latest()
        for index in range(1, workers):
            snapshot = reported.get(index)
            if snapshot is None:
                return f"worker {index} has not reported yet"
            why = snapshot.get(NOT_READY)
            if why:
                return f"worker {index}: {why}"
        return None

    return reason


def run(config: GatewayConfig,
        serve_one: Callable[[GatewayConfig, MetricsLink | None], int]) -> int:
    """Fork ``config.workers`` workers that each run ``serve_one``; supervise them."""
    children: dict[int, int] = {}
    link = MetricsLink()
    stopping = False

    def forward(signum: int, _frame: FrameType | None) -> None:
        nonlocal stopping
        stopping = True
        for child in children:
            _signal(child, signum)

    # Before forking: a SIGTERM that arrives while workers start must reach them, not kill the
    # parent and orphan them. Each worker resets both signals for its own event loop.
    signal.signal(signal.SIGTERM, forward)
    signal.signal(signal.SIGINT, forward)
    instances = distinct_instance_ids(config.workers)
    for index in range(config.workers):
        # Held across the fork: one sent to the new worker before it resets its handlers would
        # run the parent's `forward` there, which knows no children, and be lost; the worker
        # would then serve on with nobody able to stop it. Held, it waits for the reset.
        mask = signal.pthread_sigmask(signal.SIG_BLOCK, STOP_SIGNALS)
        try:
            pid = os.fork()
            if pid == 0:  # the worker
                code = 1
                try:
                    signal.signal(signal.SIGTERM, signal.SIG_DFL)
                    signal.signal(signal.SIGINT, signal.SIG_DFL)
                    signal.pthread_sigmask(signal.SIG_SETMASK, mask)
                    code = serve_one(dataclasses.replace(
                        config, worker_index=index, hub_instance=instances[index],
                        worker_instances=instances), link)
                finally:
                    os._exit(code)
            children[pid] = index
        finally:
            signal.pthread_sigmask(signal.SIG_SETMASK, mask)
        if stopping:  # asked to stop while forking: the new worker too
            _signal(pid, signal.SIGTERM)
    link.close()
    rc = 0
    while children:
        pid, status = os.wait()
        index = children.pop(pid, -1)
        if index < 0:  # not one of ours
            continue
        code = os.waitstatus_to_exitcode(status)
        if not stopping:
            log.error("gateway worker %d exited (%d): stopping the others", index, code)
            stopping = True
            rc = 1
            for child in children:
                _signal(child, signal.SIGTERM)
        elif code != 0:
            rc = rc or 1
    return rc


def _signal(pid: int, signum: int) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signum)
