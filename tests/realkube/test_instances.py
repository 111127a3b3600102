"""Issue 13: gateway instances discovered from Leases on a real hub, with real processes.

Gateways are separate processes behind Debian's HAProxy (tests/realkube/loadbalancer.py), the
way gateway pods sit behind their Services; an agent for CLUSTER dials the tunnel frontend.
The gateways use the hubproxy-gateway ServiceAccount of deploy/hub, so deploy/hub's Lease RBAC
is what lets them announce themselves.
"""

from __future__ import annotations

import json
import shutil
import signal
import subprocess
import threading
import time
import urllib.error
import urllib.request
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from tests.realkube.apiserver import write_private
from tests.realkube.conftest import Fleet
from tests.realkube.hubproxy import CLUSTER, CURL
from tests.realkube.loadbalancer import HAPROXY, Backend, backends, start_haproxy
from tests.support import LOOPBACK, BackgroundProcess, ProcessGroup, free_port, wait_for_port

NAMESPACE = "hubproxy"  # deploy/hub's namespace, where its Role grants the leases
SELECTOR = "app.kubernetes.io/component=gateway-instance"

pytestmark = pytest.mark.skipif(shutil.which("haproxy") is None and not Path(HAPROXY).exists(),
                                reason="needs Debian's haproxy (apt-get install haproxy)")


LOGS: list[BackgroundProcess] = []  # this test's processes, whose output a failure shows


def wait(check: Callable[[], object], timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            logs = "\n".join(f"--- {' '.join(p.args[3:5])}\n{p.output[-2500:]}" for p in LOGS)
            raise AssertionError(f"not reached in {timeout:.0f}s: {what}\n{logs}")
        time.sleep(0.1)


def http_get(port: int, path: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(f"http://{LOOPBACK}:{port}{path}", timeout=5) as answer:
            return answer.status, answer.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()
    except OSError as exc:
        return 0, str(exc)


def agent_metric(health: int, name: str) -> int:
    status, text = http_get(health, "/metrics")
    for line in text.splitlines() if status == 200 else ():
        if line.startswith(f"{name} "):
            return int(float(line.split()[1]))
    return -1


def agent_sessions(health: int) -> int:
    return agent_metric(health, "hubproxy_agent_tunnel_sessions")


def instance_leases(fleet: Fleet) -> dict[str, dict[str, object]]:
    listing = json.loads(fleet.hub.admin("get", "leases", "-n", NAMESPACE, "-l", SELECTOR,
                                         "-o", "json"))
    return {item["metadata"]["name"]: item for item in listing["items"]}


@pytest.fixture
def group(fleet: Fleet) -> Iterator[ProcessGroup]:
    processes = ProcessGroup()
    LOGS.clear()
    try:
        yield processes
    finally:
        processes.stop_all()
        # Leases of instances this test SIGKILLed (they would only expire).
        fleet.hub.admin("delete", "leases", "-n", NAMESPACE, "-l", SELECTOR,
                        "--ignore-not-found")


def start_instance(group: ProcessGroup, fleet: Fleet, backend: Backend,
                   *extra: str) -> BackgroundProcess:
    pki = fleet.pki
    process = group.hubproxy(
        "gateway", "--listen", f"{LOOPBACK}:{backend.front}",
        "--tunnel-listen", f"{LOOPBACK}:{backend.tunnel}",
        "--health-listen", f"{LOOPBACK}:{backend.health}",
        "--tls-dir", str(pki / "gateway"), "--tunnel-tls-dir", str(pki / "tunnel-server"),
        "--agent-ca", str(pki / "tunnel-ca" / "ca.crt"),
        "--hub-kubeconfig", str(fleet.gateway_kubeconfig), "--lease-namespace", NAMESPACE,
        *extra)
    LOGS.append(process)
    try:
        wait_for_port(backend.health, timeout=30)
    except TimeoutError:
        raise RuntimeError(f"gateway did not start:\n{process.output[-3000:]}") from None
    return process


def start_agent(group: ProcessGroup, fleet: Fleet, tunnel: int) -> tuple[BackgroundProcess, int]:
    health = free_port()
    agent = group.hubproxy(
        "agent", "--hub", f"{LOOPBACK}:{tunnel}", "--cluster", CLUSTER,
        "--tls-dir", str(fleet.pki / "agents" / CLUSTER),
        "--kubeconfig", str(fleet.agent_kubeconfig),
        "--health-listen", f"{LOOPBACK}:{health}", "--drain-timeout", "2")
    LOGS.append(agent)
    wait_for_port(health, timeout=30)
    return agent, health


def test_instances_are_discovered_from_leases_and_departed_ones_dropped(
        fleet: Fleet, group: ProcessGroup, tmp_path: Path) -> None:
    slots = backends(3)
    _lb, _front, tunnel = start_haproxy(group, tmp_path, slots)
    first = start_instance(group, fleet, slots[0], "--lease-duration", "6")
    _agent, agent_health = start_agent(group, fleet, tunnel)
    wait(lambda: len(instance_leases(fleet)) == 1, 15, "the first instance's Lease")
    lease = next(iter(instance_leases(fleet).values()))
    assert lease["spec"]["leaseDurationSeconds"] == 6
    wait(lambda: agent_sessions(agent_health) == 1, 15, "one session")
    wait(lambda: CLUSTER in instance_leases(fleet)[lease["metadata"]["name"]]["metadata"]
         .get("annotations", {}).get("hubproxy.io/clusters", ""), 15,
         "the Lease names the clusters the instance serves")

    # Scale up: nobody says how many instances there are; the agent learns it and reaches both.
    second = start_instance(group, fleet, slots[1], "--lease-duration", "6")
    wait(lambda: len(instance_leases(fleet)) == 2, 15, "two Leases")
    wait(lambda: agent_sessions(agent_health) == 2, 20, "a session to the new instance")

    # A graceful exit deletes its Lease (well before it could expire) and the agent drops to one.
    second.signal(signal.SIGTERM)
    assert second.popen.wait(timeout=30) == 0
    assert len(instance_leases(fleet)) == 1, "the Lease is deleted on exit, not left to expire"
    wait(lambda: agent_sessions(agent_health) == 1, 15, "back to one session")

    # A killed instance leaves its Lease behind: it is ignored once expired, and the agent
    # holds sessions only to the live instance.
    third = start_instance(group, fleet, slots[2], "--lease-duration", "6")
    wait(lambda: agent_sessions(agent_health) == 2, 20, "a session to the third instance")
    seen = len(first.output)
    third.signal(signal.SIGKILL)
    third.popen.wait(timeout=10)
    assert len(instance_leases(fleet)) == 2, "a killed instance cannot delete its Lease"
    wait(lambda: agent_sessions(agent_health) == 1, 15, "the killed instance's session dropped")
    wait(lambda: "live gateway instances: 1 " in first.output[seen:], 20,
         "the first instance announces itself alone once the killed one's Lease expired")
    # Still one session a while later: the agent does not keep dialling a gone instance in.
    time.sleep(2)
    assert agent_sessions(agent_health) == 1
    assert first.popen.poll() is None
    assert agent_metric(agent_health, "hubproxy_agent_hub_connected") == 1
    # No instance left (a hub outage, as the agent sees it): the metric says so.
    first.signal(signal.SIGTERM)
    wait(lambda: agent_metric(agent_health, "hubproxy_agent_hub_connected") == 0, 15,
         "the agent reports it lost the hub")


class Load:
    """Sequential GETs through the load balancer with curl (a new connection each), bounded in
    count and time; statuses counted."""

    def __init__(self, fleet: Fleet, front: int, limit: int = 3000, seconds: float = 120) -> None:
        self.args = [CURL, "-sS", "-w", "\n%{http_code}", "--max-time", "10",
                     "--cacert", str(fleet.pki / "front-ca" / "ca.crt"),
                     "-H", f"@{auth_header(fleet)}", f"https://{LOOPBACK}:{front}/{CLUSTER}/version"]
        self.limit, self.seconds = limit, seconds
        self.statuses: Counter[str] = Counter()
        self.failures: list[tuple[float, str]] = []  # (when, body) of the first few failures
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        deadline = time.monotonic() + self.seconds
        while not self._stop.is_set() and time.monotonic() < deadline \
                and sum(self.statuses.values()) < self.limit:
            done = subprocess.run(self.args, capture_output=True, text=True, timeout=15)
            body, _, code = done.stdout.rpartition("\n")
            status = code.strip() or f"curl exit {done.returncode}"
            self.statuses[status] += 1
            if status != "200" and len(self.failures) < 5:
                self.failures.append((time.time(), (body or done.stderr)[:300]))

    def __enter__(self) -> Load:
        self._thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._stop.set()
        self._thread.join(timeout=20)


def auth_header(fleet: Fleet) -> Path:
    """alice's Authorization header in a file for curl -H @FILE: not on a command line that a
    failure message would print."""
    path = fleet.root / "alice.header"
    if not path.exists():
        write_private(path, f"Authorization: Bearer {fleet.alice}\n")
    return path


def ready(health: int) -> bool:
    return http_get(health, "/readyz")[0] == 200


def test_new_instance_is_not_ready_until_it_serves_what_the_others_serve_within_its_bound(
        fleet: Fleet, group: ProcessGroup) -> None:
    first_slot, second_slot = backends(2)
    start_instance(group, fleet, first_slot)
    _agent, agent_health = start_agent(group, fleet, first_slot.tunnel)
    wait(lambda: ready(first_slot.health), 20, "the first instance ready")
    wait(lambda: agent_sessions(agent_health) == 1, 15, "the agent connected")
    # No agent can reach the second instance (nothing dials its tunnel port): it says why it
    # is not ready, naming the cluster the first instance serves, until its bound passes.
    started = time.monotonic()
    second = start_instance(group, fleet, second_slot, "--ready-wait", "6s")
    wait(lambda: CLUSTER in http_get(second_slot.health, "/readyz")[1], 10,
         "the second instance waits for the cluster the first serves")
    assert not ready(second_slot.health)
    wait(lambda: ready(second_slot.health), 15, "ready after --ready-wait")
    assert time.monotonic() - started >= 5.5
    wait(lambda: "ready: the readiness wait passed" in second.output, 5, "the reason logged")


def test_rolling_replacement_behind_a_load_balancer_fails_no_request_and_ends_watches_cleanly(
        fleet: Fleet, group: ProcessGroup, tmp_path: Path) -> None:
    slots = backends(3)
    _lb, front, tunnel = start_haproxy(group, tmp_path, slots)
    options = ("--lease-duration", "6", "--ready-wait", "30s", "--shutdown-delay", "1s")
    old = start_instance(group, fleet, slots[0], *options)
    _agent, agent_health = start_agent(group, fleet, tunnel)
    wait(lambda: ready(slots[0].health), 20, "the first instance ready")
    wait(lambda: fleet.gateway.curl(f"/{CLUSTER}/version", fleet.alice)[0] == 200, 10, "")
    with Load(fleet, front) as load:
        wait(lambda: load.statuses["200"] >= 5, 20, "requests through the load balancer")
        for slot in (1, 2):
            # Surge: a new instance; it is Ready (so the load balancer sends it requests) only
            # once the agent reached it -- not by the bound.
            new = start_instance(group, fleet, slots[slot], *options)
            wait(lambda s=slot: ready(slots[s].health), 25, "the new instance ready")
            wait(lambda n=new: "serves every cluster the other instances serve" in n.output, 5,
                 "ready because the agent reached it")
            wait(lambda: agent_sessions(agent_health) == 2, 15, "sessions to both")
            # A watch on the instance about to go (only it is behind the LB's port for now).
            watch = group.start(
                [CURL, "-sS", "-N", "-o", "/dev/null", "--cacert",
                 str(fleet.pki / "front-ca" / "ca.crt"), "-H", f"@{auth_header(fleet)}",
                 f"https://{LOOPBACK}:{slots[slot - 1].front}/{CLUSTER}/api/v1/namespaces/team/"
                 "configmaps?watch=1"])
            time.sleep(1)
            assert watch.popen.poll() is None, "the watch is open"
            # Unavailable 0: the old instance leaves only now, gracefully.
            stopped = time.monotonic()
            old.signal(signal.SIGTERM)
            # The watch ends with a clean last chunk (curl exits 0, not 18 "partial file")
            # right after the shutdown delay, not at the 25 s drain deadline.
            assert watch.popen.wait(timeout=15) == 0, watch.output
            assert time.monotonic() - stopped < 5
            assert old.popen.wait(timeout=30) == 0
            wait(lambda: agent_sessions(agent_health) == 1, 15, "the old session dropped")
            old = new
        time.sleep(1)
    print(f"requests through the load balancer during the replacement: {dict(load.statuses)}")
    # Every process's log, to read after a failure (pytest keeps the last runs' tmp_path).
    (tmp_path / "processes.log").write_text("\n".join(
        f"--- {' '.join(p.args[3:5])}\n{p.output}" for p in LOGS) + f"\n{load.failures}")
    # Every request 200: an OPEN that crosses an agent's drain (a duplicate or rotated
    # session) is sent again on another session by the gateway (Exchange._reopen).
    assert set(load.statuses) == {"200"}, (load.statuses, load.failures)
    assert load.statuses["200"] >= 30, load.statuses


def test_sigkill_of_one_instance_fails_only_requests_in_flight(
        fleet: Fleet, group: ProcessGroup, tmp_path: Path) -> None:
    slots = backends(2)
    _lb, front, tunnel = start_haproxy(group, tmp_path, slots)
    first = start_instance(group, fleet, slots[0], "--lease-duration", "6")
    _agent, agent_health = start_agent(group, fleet, tunnel)
    wait(lambda: ready(slots[0].health), 20, "the first instance ready")
    start_instance(group, fleet, slots[1], "--lease-duration", "6")
    wait(lambda: ready(slots[1].health), 25, "the second instance ready")
    wait(lambda: agent_sessions(agent_health) == 2, 15, "sessions to both")
    with Load(fleet, front) as load:
        wait(lambda: load.statuses["200"] >= 20, 20, "requests through the load balancer")
        killed_at = time.time()
        first.signal(signal.SIGKILL)
        first.popen.wait(timeout=10)
        wait(lambda: agent_sessions(agent_health) == 1, 15, "the killed instance's session")
        time.sleep(3)
    print(f"SIGKILL of one of two instances under load: {dict(load.statuses)}, failures "
          f"{[round(at - killed_at, 2) for at, _ in load.failures]} s after the kill")
    # A sequential client has at most one request in flight on the killed instance.
    failed = sum(n for status, n in load.statuses.items() if status != "200")
    assert failed <= 1, (load.statuses, load.failures)
    assert all(at - killed_at < 2 for at, _ in load.failures), load.failures


def test_each_worker_is_an_instance_with_its_own_lease(fleet: Fleet, group: ProcessGroup) -> None:
    (slot,) = backends(1)
    gateway = start_instance(group, fleet, slot, "--workers", "2")
    _agent, agent_health = start_agent(group, fleet, slot.tunnel)
    wait(lambda: len(instance_leases(fleet)) == 2, 15, "one Lease per worker")
    wait(lambda: agent_sessions(agent_health) == 2, 20, "a session to each worker")
    gateway.signal(signal.SIGTERM)
    assert gateway.popen.wait(timeout=30) == 0
    assert instance_leases(fleet) == {}, "both workers deleted their Lease"
