"""An agent that drains (SIGTERM) ends its watches cleanly at once (issue 13, found by
``bench ha``): the gateway, told by the agent's DRAIN, ends every watch and follow on that
session with the last chunk, so client-go re-watches through another agent replica instead of
being cut with a truncated body when the agent's ``--drain-timeout`` (5 s here) runs out."""

from __future__ import annotations

import signal
import subprocess
import time

from tests.e2e.conftest import CURL, System


def test_agent_sigterm_ends_its_watches_cleanly_before_its_drain_deadline(
        system: System) -> None:
    cluster = "cluster2"
    before = system.clusters[cluster].watcher_count
    watch = subprocess.Popen(
        [CURL, "-sSN", "-o", "/dev/null", "--cacert", str(system.ca_file), "-H",
         f"Authorization: Bearer {system.token}",
         f"{system.front}/{cluster}/api/v1/namespaces/default/configmaps?watch=1"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        deadline = time.monotonic() + 10
        while system.clusters[cluster].watcher_count <= before:
            assert time.monotonic() < deadline, "the watch never reached the cluster"
            assert watch.poll() is None, watch.communicate()
            time.sleep(0.05)
        agent = system.agents[cluster]
        stopped = time.monotonic()
        agent.popen.send_signal(signal.SIGTERM)
        # curl exits 0 only after the last chunk (18, "partial file", on a cut body).
        assert watch.wait(10) == 0, watch.communicate()
        ended = time.monotonic() - stopped
        assert ended < 3, f"the watch ended {ended:.1f}s after SIGTERM: at the drain deadline"
        # With nothing left in flight the agent's drain is over early too (it used to wait
        # its whole --drain-timeout: two drains of one session, one waiting on a lost future).
        assert agent.popen.wait(10) == 0
        assert time.monotonic() - stopped < 3, "the agent waited for its drain deadline"
    finally:
        if watch.poll() is None:
            watch.kill()
            watch.wait(5)
        if system.agents[cluster].popen.poll() is not None:
            system.start_agent(cluster)
    system.wait_cluster(cluster, timeout=30)
