"""Issue 13 with ``--workers``: every worker is an instance with its own Lease and its own
sessions, and worker 0's ``/readyz`` (the pod's) is 200 only when every worker is ready: the
kernel spreads the pod's connections over all workers, so a worker that no agent has reached
yet would answer 503 "cluster not connected" behind a Ready pod."""

from __future__ import annotations

import time

from tests.realkube.conftest import Fleet
from tests.realkube.hubproxy import CLUSTER
from tests.realkube.loadbalancer import backends
from tests.realkube.test_instances import (
    agent_sessions,
    http_get,
    ready,
    start_agent,
    start_instance,
    wait,
)
from tests.realkube.test_instances import group as group  # the fixture
from tests.support import ProcessGroup


def test_the_pod_is_ready_only_once_every_worker_serves_what_the_others_serve(
        fleet: Fleet, group: ProcessGroup) -> None:
    first, second = backends(2)
    start_instance(group, fleet, first)
    _agent, first_agent = start_agent(group, fleet, first.tunnel)
    wait(lambda: ready(first.health), 20, "the first instance ready")
    wait(lambda: agent_sessions(first_agent) >= 1, 15, "the first instance serves the cluster")
    start_instance(group, fleet, second, "--workers", "2", "--ready-wait", "60s")
    # Worker 0 answers for the pod and says which worker it waits for.
    wait(lambda: "worker 1: waiting for agents" in http_get(second.health, "/readyz")[1], 20,
         "worker 0's /readyz names worker 1, which no agent reached")
    assert CLUSTER in http_get(second.health, "/readyz")[1]
    _agent2, agent_health = start_agent(group, fleet, second.tunnel)
    deadline = time.monotonic() + 45
    while not ready(second.health):
        assert time.monotonic() < deadline, http_get(second.health, "/readyz")
        time.sleep(0.05)
    # Ready only now that the agent holds a session to both workers (the worker's report is at
    # most a second old, and a session once held stays while nothing leaves).
    assert agent_sessions(agent_health) >= 2, "Ready while a worker had no session"
