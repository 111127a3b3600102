"""``python -m bench ha``: rollouts, scaling, crashes and a hub outage under steady load (issue 13).

What runs, all on 127.0.0.1 with real TLS on every hop:

* a real hub: etcd + kube-apiserver from the real-apiserver test tier (``tests/realkube``), with
  ``deploy/hub``'s RBAC applied; the gateways use its TokenReview and SubjectAccessReview, and
  hold their instance Leases there;
* ``hubproxy gateway`` processes (2 at rest), each its own front door, tunnel and health port,
  behind Debian's HAProxy in TCP mode (TLS passes through): the front door frontend balances
  over instances whose ``/readyz`` answers 200, the tunnel frontend over every instance that
  accepts a connection (a Service with ``publishNotReadyAddresses``, as deploy/hub has it);
* two kubesim managed clusters with two ``hubproxy agent`` replicas each, dialling the tunnel
  frontend;
* steady load (:mod:`bench.haload`): wrk keep-alive GETs, paced probes on fresh connections,
  and 100 watches, all through HAProxy.

Events, in order, each with the load running: a rolling replacement of every instance (surge 1,
unavailable 0), scale 2 -> 4 -> 2, SIGKILL of one instance (then a replacement), SIGTERM of one
agent replica (then a restart), and a hub kube-apiserver outage (stopped, restarted after
``--outage`` seconds), during which requests with never-seen tokens are sent.

For each event: requests (wrk + probes), failed requests by status or connection error, watch
ends (clean vs interrupted), time to full service (the action until the last failure seen) and
time until steady (every instance Ready, every agent holding a session to each). ``--json FILE``
writes everything, a table goes to stdout.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import platform
import shutil
import signal
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from bench.haload import Load, Observation, WrkWindow
from bench.procs import LOOPBACK, Proc, Procs, free_port, wait_for_port

CLUSTERS = ["ha1", "ha2"]
NAMESPACE = "hubproxy"  # deploy/hub's namespace: its Role grants the Leases there
USER_SA = ("fleet", "bench")
MAPPED_USER = "cluster:hub:system:serviceaccount:fleet:bench"
AGENT_USER = "hubproxy-agent"
HAPROXY = shutil.which("haproxy") or "/usr/sbin/haproxy"
SLOTS = 6  # backends HAProxy knows; at most 4 instances run at once (scale to 4)
PROBE_PATH = "/api/v1/namespaces/default/configmaps/bench"


@dataclass(frozen=True)
class Plan:
    watches: int = 100
    settle: float = 5.0  # load running before and after each event
    scale_hold: float = 5.0  # at 4 instances
    outage: float = 30.0
    wrk_connections: int = 8
    shutdown_delay: str = "2s"
    token_cache_ttl: str = "10s"
    fresh_tokens: int = 60
    kill_hold: float = 3.0  # after a SIGKILL, before the replacement starts

    @staticmethod
    def smoke() -> Plan:
        return Plan(watches=20, settle=0.5, scale_hold=0.5, outage=5.0, wrk_connections=4,
                    shutdown_delay="1s", fresh_tokens=20, kill_hold=1.0)


@dataclass
class Slot:
    front: int
    tunnel: int
    health: int
    proc: Proc | None = None

    @property
    def running(self) -> bool:
        return self.proc is not None and self.proc.alive()


@dataclass
class Agent:
    cluster: str
    replica: int
    health: int
    args: list[str]
    proc: Proc | None = None


@dataclass
class Event:
    name: str
    started: float = 0.0
    action_at: float = 0.0  # the disruptive step (kill, SIGTERM, apiserver stop, ...)
    ended: float = 0.0
    steady_at: float | None = None
    recovery_from: float | None = None  # the hub back: full service is counted from here
    wrk: dict[str, Any] = field(default_factory=dict)
    notes: dict[str, Any] = field(default_factory=dict)


# --- the system --------------------------------------------------------------------------------

class System:
    def __init__(self, root: Path, plan: Plan) -> None:
        self.root = root
        self.plan = plan
        self.procs = Procs(root)
        self.pki = root / "pki"
        self.slots = [Slot(free_port(), free_port(), free_port()) for _ in range(SLOTS)]
        self.agents: list[Agent] = []
        self.instances: list[Slot] = []  # running, oldest first
        self.front = 0
        self.tunnel = 0
        self.hub: Any = None  # tests.realkube.apiserver.RealKube
        self.hub_group: Any = None  # tests.support.ProcessGroup (etcd, apiserver)
        self.gateway_kubeconfig = root / "gateway.kubeconfig"
        self.user_token = ""
        self.fresh: list[str] = []
        self.started_count = 0

    # hub ----------------------------------------------------------------------------------------

    def start_hub(self) -> None:
        from tests.realkube.apiserver import launch_apiserver, start_etcd, wait_ready
        from tests.realkube.binaries import REPO, find_binaries
        from tests.support import ProcessGroup

        binaries = find_binaries()
        self.hub_group = ProcessGroup()
        etcd = start_etcd(self.hub_group, binaries, self.root / "hub")
        self.hub = launch_apiserver(self.hub_group, binaries, "hub", self.root / "hub" / "api",
                                    etcd)
        wait_ready(self.hub)
        self.hub.admin("apply", "--validate=false", "-k", str(REPO / "deploy" / "hub"))
        self.hub.apply(hub_users())
        self.hub.kubeconfig(self.gateway_kubeconfig,
                            token=self.hub.create_token(NAMESPACE, "hubproxy-gateway"))
        self.user_token = self.token()
        self.fresh = [self.token() for _ in range(self.plan.fresh_tokens)]

    def token(self) -> str:
        """A new bound token of fleet/bench (TokenRequest): a token no gateway has cached."""
        ns, name = USER_SA
        status, body = self.hub.request(
            "POST", f"/api/v1/namespaces/{ns}/serviceaccounts/{name}/token",
            {"apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest",
             "spec": {"expirationSeconds": 7200}})
        if status != 201:
            raise RuntimeError(f"TokenRequest: {status} {body}")
        return str(body["status"]["token"])

    def stop_hub(self) -> None:
        self.hub.process.stop(timeout=20)

    def restart_hub(self) -> None:
        from tests.realkube.apiserver import wait_ready

        self.hub.process = self.hub_group.start(self.hub.process.args)
        wait_ready(self.hub)

    # managed clusters ---------------------------------------------------------------------------

    def start_clusters(self) -> None:
        from certs import layout
        from gateway.fixtures import agent_kubeconfig, managed_rbac, token_csv, write_private

        layout.init(self.pki, layout.InitOptions(clusters=CLUSTERS))
        for cluster in CLUSTERS:
            home = self.root / cluster
            home.mkdir()
            agent_token = f"agent-{cluster}-{time.monotonic_ns()}"
            tokens = write_private(home / "tokens.csv",
                                   token_csv([(agent_token, AGENT_USER, "agent-uid", [])]))
            rbac = home / "rbac.yaml"
            rbac.write_text(yaml.safe_dump_all(managed_rbac(MAPPED_USER)))
            port = free_port()
            sim = self.procs.start(f"kubesim-{cluster}", [
                sys.executable, "-m", "kubesim", "--listen", f"{LOOPBACK}:{port}",
                "--cert-dir", str(home / "tls"), "--token-auth-file", str(tokens),
                "--rbac-file", str(rbac), "--name", cluster])
            sim.wait_for_line("kubesim ready on", 30)
            ca = str(home / "tls" / "ca.crt")
            write_private(home / "agent.token", agent_token)
            kubeconfig = write_private(home / "agent.kubeconfig", yaml.safe_dump(
                agent_kubeconfig(f"https://{LOOPBACK}:{port}", ca, str(home / "agent.token"))))
            create_probe_object(port, ca, agent_token)
            for replica in range(2):
                health = free_port()
                self.agents.append(Agent(cluster, replica, health, [
                    sys.executable, "-m", "gateway.cli", "agent",
                    "--hub", f"{LOOPBACK}:{{tunnel}}", "--cluster", cluster,
                    "--tls-dir", str(self.pki / "agents" / cluster),
                    "--kubeconfig", str(kubeconfig), "--health-listen", f"{LOOPBACK}:{health}",
                    "--drain-timeout", "5"]))

    def start_agent(self, agent: Agent) -> None:
        args = [a.replace("{tunnel}", str(self.tunnel)) for a in agent.args]
        agent.proc = self.procs.start(f"agent-{agent.cluster}-{agent.replica}-"
                                      f"{time.monotonic_ns() % 100000}", args)
        wait_for_port(agent.health, 30)

    # load balancer and instances ----------------------------------------------------------------

    def start_haproxy(self) -> None:
        self.front, self.tunnel = free_port(), free_port()
        path = self.root / "haproxy.cfg"
        path.write_text(haproxy_config(self.front, self.tunnel, self.slots))
        self.procs.start("haproxy", [HAPROXY, "-db", "-f", str(path)])
        wait_for_port(self.front, 10)
        wait_for_port(self.tunnel, 10)

    def start_instance(self) -> Slot:
        slot = next(s for s in self.slots if not s.running and s not in self.instances)
        self.started_count += 1
        slot.proc = self.procs.start(f"gateway-{self.started_count}", [
            sys.executable, "-m", "gateway.cli", "gateway",
            "--listen", f"{LOOPBACK}:{slot.front}", "--tunnel-listen", f"{LOOPBACK}:{slot.tunnel}",
            "--health-listen", f"{LOOPBACK}:{slot.health}",
            "--tls-dir", str(self.pki / "gateway"),
            "--tunnel-tls-dir", str(self.pki / "tunnel-server"),
            "--agent-ca", str(self.pki / "tunnel-ca" / "ca.crt"),
            "--hub-kubeconfig", str(self.gateway_kubeconfig),
            "--lease-namespace", NAMESPACE, "--cluster-inventory", "none",
            "--token-cache-ttl", self.plan.token_cache_ttl,
            "--shutdown-delay", self.plan.shutdown_delay, "--log-level", "info"])
        self.instances.append(slot)
        wait_for_port(slot.health, 30)
        return slot

    def wait_ready(self, slot: Slot, timeout: float = 45) -> None:
        deadline = time.monotonic() + timeout
        while http_get(slot.health, "/readyz")[0] != 200:
            if time.monotonic() > deadline or not slot.running:
                assert slot.proc is not None
                raise RuntimeError(f"{slot.proc.name} not ready:\n{slot.proc.output()}")
            time.sleep(0.1)

    def stop_instance(self, slot: Slot, signum: int = signal.SIGTERM) -> int:
        assert slot.proc is not None
        slot.proc.popen.send_signal(signum)
        code = slot.proc.popen.wait(60)
        self.instances.remove(slot)
        return code

    # state --------------------------------------------------------------------------------------

    def steady(self) -> bool:
        """Every instance Ready and every agent replica holding a session to each of them."""
        if not all(http_get(s.health, "/readyz")[0] == 200 for s in self.instances):
            return False
        want = len(self.instances)
        return all(agent_sessions(a.health) == want for a in self.agents)

    def wait_steady(self, timeout: float = 120) -> float:
        # Long: an agent that keeps reaching instances it already holds through the balancer
        # redials with a delay that doubles once the balancer's odds say it should have found
        # the missing instance (tunnel.redial), up to 30 s between dials.
        deadline = time.monotonic() + timeout
        while not self.steady():
            if time.monotonic() > deadline:
                raise RuntimeError(f"not steady after {timeout:g}s: " + self.describe())
            time.sleep(0.1)
        return time.monotonic()

    def describe(self) -> str:
        ready = [http_get(s.health, "/readyz") for s in self.instances]
        sessions = [agent_sessions(a.health) for a in self.agents]
        return f"instances {len(self.instances)} readyz {[r[0] for r in ready]} " \
               f"({[r[1][:80] for r in ready if r[0] != 200]}), agent sessions {sessions}"

    def close(self) -> None:
        self.procs.stop_all()
        if self.hub_group is not None:
            self.hub_group.stop_all()


def hub_users() -> list[dict[str, Any]]:
    """fleet/bench may `get managedclusters/proxy` of both clusters (what --authorize=sar asks)."""
    ns, name = USER_SA
    return [
        {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}},
        {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": name, "namespace": ns}},
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole",
         "metadata": {"name": "bench-uses-clusters"},
         "rules": [{"apiGroups": ["cluster.open-cluster-management.io"],
                    "resources": ["managedclusters/proxy"], "resourceNames": CLUSTERS,
                    "verbs": ["get"]}]},
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding",
         "metadata": {"name": "bench-uses-clusters"},
         "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole",
                     "name": "bench-uses-clusters"},
         "subjects": [{"kind": "ServiceAccount", "name": name, "namespace": ns}]},
    ]


def create_probe_object(port: int, ca: str, token: str) -> None:
    """The ConfigMap the probes and wrk GET (created as the agent user, which kubesim lets
    impersonate; the mapped user may create ConfigMaps too)."""
    import ssl

    body = json.dumps({"apiVersion": "v1", "kind": "ConfigMap",
                       "metadata": {"name": "bench", "namespace": "default"},
                       "data": {"a": "b"}}).encode()
    request = urllib.request.Request(
        f"https://{LOOPBACK}:{port}/api/v1/namespaces/default/configmaps", data=body,
        method="POST", headers={"Authorization": f"Bearer {token}",
                                "Content-Type": "application/json",
                                "Impersonate-User": MAPPED_USER})
    with urllib.request.urlopen(request, context=ssl.create_default_context(cafile=ca),
                                timeout=10) as answer:
        assert answer.status == 201, answer.status


def haproxy_config(front: int, tunnel: int, slots: list[Slot]) -> str:
    """TCP mode both ways (TLS passes through to the gateways), as the realkube tier's: the
    front door balances over instances whose /readyz says 200; the tunnel over every instance
    that accepts (agents must reach a new instance before it is Ready). Slots not running are
    simply down."""
    from tests.realkube.loadbalancer import config

    return config(front, tunnel, slots, maxconn=8192, check_ms=250)


def http_get(port: int, path: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(f"http://{LOOPBACK}:{port}{path}", timeout=5) as answer:
            return answer.status, answer.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode(errors="replace")
    except OSError as exc:
        return 0, str(exc)


def agent_sessions(health: int) -> int:
    status, text = http_get(health, "/metrics")
    for line in text.splitlines() if status == 200 else ():
        if line.startswith("hubproxy_agent_tunnel_sessions "):
            return int(float(line.split()[1]))
    return -1


# --- events ------------------------------------------------------------------------------------

class Runner:
    def __init__(self, system: System, load: Load, plan: Plan) -> None:
        self.system = system
        self.load = load
        self.plan = plan
        self.events: list[Event] = []

    def run(self, name: str, body: Callable[[Event], None]) -> Event:
        event = Event(name, started=time.monotonic())
        print(f"[ha] {name} ...", flush=True)
        paths = [f"/{c}{PROBE_PATH}" for c in CLUSTERS]
        wrk = WrkWindow(f"https://{LOOPBACK}:{self.system.front}", self.system.user_token,
                        paths, self.system.root, connections=self.plan.wrk_connections,
                        limit=600)
        wrk.start()
        try:
            time.sleep(self.plan.settle)
            event.action_at = time.monotonic()
            body(event)
            if event.steady_at is None:
                event.steady_at = self.system.wait_steady()
            time.sleep(self.plan.settle)
        finally:
            event.ended = time.monotonic()
            event.wrk = wrk.stop()
        self.events.append(event)
        print(f"[ha] {name}: {summary_line(summarize(event, self.load))}", flush=True)
        return event

    # the five events ------------------------------------------------------------------------

    def rolling_replacement(self, event: Event) -> None:
        for old in list(self.system.instances):
            new = self.system.start_instance()
            self.system.wait_ready(new)
            code = self.system.stop_instance(old)
            event.notes.setdefault("exit_codes", []).append(code)

    def scale(self, event: Event) -> None:
        for _ in range(2):
            new = self.system.start_instance()
            self.system.wait_ready(new)
        event.notes["up_steady_s"] = self.system.wait_steady() - event.action_at
        time.sleep(self.plan.scale_hold)
        for old in list(self.system.instances[:2]):
            event.notes.setdefault("exit_codes", []).append(self.system.stop_instance(old))

    def sigkill(self, event: Event) -> None:
        victim = self.system.instances[0]
        self.system.stop_instance(victim, signal.SIGKILL)
        # Full service must come back without the replacement: hold before starting it.
        time.sleep(self.plan.kill_hold)
        replacement = self.system.start_instance()
        self.system.wait_ready(replacement)

    def agent_sigterm(self, event: Event) -> None:
        agent = self.system.agents[0]
        assert agent.proc is not None
        agent.proc.popen.send_signal(signal.SIGTERM)
        event.notes["exit_code"] = agent.proc.popen.wait(60)
        event.notes["exited_after_s"] = time.monotonic() - event.action_at
        self.system.start_agent(agent)

    def hub_outage(self, event: Event) -> None:
        system = self.system
        system.stop_hub()
        event.notes["stopped_after_s"] = time.monotonic() - event.action_at
        fresh = iter(system.fresh)
        used: list[Observation] = []
        # The outage counts from the process's exit (a loaded apiserver may take seconds to
        # stop), and at least one uncached request is sent during it.
        restart_at = time.monotonic() + self.plan.outage
        path = f"/{CLUSTERS[0]}{PROBE_PATH}"
        while time.monotonic() < restart_at or not used:
            token = next(fresh, None)
            if token is None:
                break
            used.append(self.load.fresh_probe(token, path))
            time.sleep(0.5)
        time.sleep(max(0.0, restart_at - time.monotonic()))
        restarted = time.monotonic()
        system.restart_hub()
        event.recovery_from = time.monotonic()
        event.notes["apiserver_ready_after_restart_s"] = time.monotonic() - restarted
        event.notes["outage_s"] = time.monotonic() - event.action_at
        # Uncached tokens again: until one is answered 200.
        recovered = None
        for token in fresh:
            if self.load.fresh_probe(token, path).outcome == "200":
                recovered = time.monotonic()
                break
            time.sleep(0.2)
        event.notes["fresh_during_outage"] = dict(Counter(o.outcome for o in used))
        event.notes["fresh_with_retry_after"] = sum(
            1 for o in used if o.outcome == "503" and o.retry_after)
        event.notes["fresh_max_latency_s"] = max((o.latency for o in used), default=0.0)
        event.notes["fresh_ok_after_hub_back_s"] = (
            None if recovered is None else recovered - restarted)


# --- report ------------------------------------------------------------------------------------

def summarize(event: Event, load: Load) -> dict[str, Any]:
    seen = load.since(event.started, event.ended)
    probes = [o for o in seen if o.source == "probe"]
    watches = [o for o in seen if o.source == "watch"]
    failed: Counter[str] = Counter(event.wrk.get("failed", {}))
    probe_failed = Counter(o.outcome for o in probes if o.outcome != "200")
    for outcome, n in probe_failed.items():
        failed[outcome] += n
    watch_errors = Counter(o.outcome.removeprefix("error:") for o in watches
                           if o.outcome != "clean")
    failures = [o.at for o in seen
                if (o.source == "probe" and o.outcome != "200")
                or (o.source == "watch" and o.outcome != "clean")]
    after = [t for t in failures if t >= event.action_at]
    since = event.recovery_from or event.action_at
    wrk_errors = sum(event.wrk.get("failed", {}).values())
    requests = event.wrk.get("requests", 0) + sum(
        v for k, v in event.wrk.get("failed", {}).items() if k.startswith("wrk ")) + len(probes)
    return {
        "requests": requests,
        "failed": sum(failed.values()),
        "failed_by_status": dict(sorted(failed.items())),
        "wrk": event.wrk,
        "wrk_failed": wrk_errors,
        "probes": len(probes),
        "probe_failed": dict(probe_failed),
        "probe_retry_after": sum(1 for o in probes if o.outcome == "503" and o.retry_after),
        "probe_max_latency_s": round(max((o.latency for o in probes), default=0.0), 3),
        "watch_clean_ends": sum(1 for o in watches if o.outcome == "clean"),
        "watch_interruptions": dict(watch_errors),
        "time_to_full_service_s": round(max(0.0, max(after) - since), 2) if after else 0.0,
        "counted_from": "hub back (apiserver ready)" if event.recovery_from else "the action",
        "time_to_steady_s": (round(event.steady_at - event.action_at, 2)
                             if event.steady_at else None),
        "first_failure_s": round(min(after) - event.action_at, 2) if after else None,
        "seconds": round(event.ended - event.started, 1),
        "notes": event.notes,
    }


def summary_line(s: dict[str, Any]) -> str:
    return (f"{s['requests']} requests, {s['failed']} failed {s['failed_by_status']}, watches "
            f"{s['watch_clean_ends']} clean ends / {sum(s['watch_interruptions'].values())} "
            f"interrupted {s['watch_interruptions']}, full service after "
            f"{s['time_to_full_service_s']}s, steady after {s['time_to_steady_s']}s")


def goals(results: dict[str, dict[str, Any]], plan: Plan) -> dict[str, dict[str, Any]]:
    out: dict[str, dict[str, Any]] = {}
    for name in ("rolling_replacement", "scale_2_4_2", "agent_sigterm"):
        r = results[name]
        ok = r["failed"] == 0 and not r["watch_interruptions"]
        out[f"{name}_zero_failures"] = {
            "pass": ok, "measured": f"{r['failed']} failed, "
            f"{sum(r['watch_interruptions'].values())} watch interruptions",
            "goal": "0 failed requests; watches end only with a clean end of stream"}
    kill = results["sigkill"]
    out["sigkill_full_service_2s"] = {
        "pass": kill["time_to_full_service_s"] <= 2.0,
        "measured": f"{kill['time_to_full_service_s']}s ({kill['failed']} failed, "
                    f"{sum(kill['watch_interruptions'].values())} watches interrupted)",
        "goal": "only requests in flight on the killed instance fail; full service within 2 s"}
    outage = results["hub_outage"]
    notes = outage["notes"]
    fresh = notes.get("fresh_during_outage", {})
    fresh_ok = bool(fresh) and set(fresh) == {"503"} and \
        notes.get("fresh_with_retry_after") == fresh.get("503")
    hangs = outage["probe_max_latency_s"] >= 10 or notes.get("fresh_max_latency_s", 0) >= 10
    out["hub_outage_uncached_503_retry_after"] = {
        "pass": fresh_ok, "measured": f"{fresh}, {notes.get('fresh_with_retry_after')} with "
        "Retry-After", "goal": "tokens not cached: 503 with Retry-After"}
    out["hub_outage_nothing_hangs"] = {
        "pass": not hangs, "measured": f"slowest probe {outage['probe_max_latency_s']}s, "
        f"slowest uncached {notes.get('fresh_max_latency_s', 0):.2f}s",
        "goal": "every request answered (10 s client timeout)"}
    only_503 = set(outage["failed_by_status"]) <= {"503"}
    if outage["failed"] == 0:
        cached = (f"every request with a known token answered through the outage "
                  f"({outage['requests']} requests; --token-cache-ttl {plan.token_cache_ttl}, "
                  "--hub-outage-grace default)")
    else:
        cached = (f"the known token answered 200 until {outage['first_failure_s']}s into the "
                  f"outage, then {outage['failed']} failed: {outage['failed_by_status']}, "
                  f"probes' 503 with Retry-After {outage['probe_retry_after']}/"
                  f"{outage['probe_failed'].get('503', 0)}"
                  + ("" if only_503 else " (not only 503)"))
    out["hub_outage_cached_tokens"] = {
        "pass": outage["failed"] == 0,
        "measured": cached,
        "goal": "requests whose tokens are cached keep working"}
    return out


TITLES = {"rolling_replacement": "rolling replacement (surge 1)", "scale_2_4_2": "scale 2->4->2",
          "sigkill": "SIGKILL one instance", "agent_sigterm": "SIGTERM one agent replica",
          "hub_outage": "hub apiserver outage"}


def table(results: dict[str, dict[str, Any]]) -> str:
    rows = [("event", "requests", "failed", "failed by status", "watch clean/intr",
             "full service s", "steady s")]
    for name, r in results.items():
        rows.append((TITLES.get(name, name), f"{r['requests']:,}", str(r["failed"]),
                     ", ".join(f"{k}: {v}" for k, v in r["failed_by_status"].items()) or "-",
                     f"{r['watch_clean_ends']}/{sum(r['watch_interruptions'].values())}",
                     f"{r['time_to_full_service_s']:.2f}",
                     "-" if r["time_to_steady_s"] is None else f"{r['time_to_steady_s']:.1f}"))
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    return "\n".join("  ".join(c.ljust(w) if i in (0, 3) else c.rjust(w)
                               for i, (c, w) in enumerate(zip(row, widths, strict=True)))
                     for row in rows)


# --- main --------------------------------------------------------------------------------------

def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench ha", description=__doc__.split(
        "\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--json", type=Path, help="write every figure here")
    parser.add_argument("--smoke", action="store_true",
                        help="short: 20 watches, 1 s settles, a 5 s hub outage (~60 s)")
    parser.add_argument("--watches", type=int, help="open watches (default 100)")
    parser.add_argument("--outage", type=float, help="hub outage seconds (default 30)")
    parser.add_argument("--token-cache-ttl", help="the gateways' --token-cache-ttl (default "
                        "10s, the gateway's own default)")
    parser.add_argument("--keep", action="store_true", help="keep the work directory (logs)")
    args = parser.parse_args(argv)
    plan = Plan.smoke() if args.smoke else Plan()
    overrides = {k: v for k, v in (("watches", args.watches), ("outage", args.outage),
                                   ("token_cache_ttl", args.token_cache_ttl)) if v is not None}
    plan = Plan(**{**plan.__dict__, **overrides})
    missing = [tool for tool, path in (("haproxy", HAPROXY), ("wrk", shutil.which("wrk")))
               if not path or not Path(path).exists()]
    if missing:
        print(f"bench ha needs {', '.join(missing)} (apt-get install -y {' '.join(missing)})",
              file=sys.stderr)
        return 2
    root = Path(tempfile.mkdtemp(prefix="bench-ha-"))
    system = System(root, plan)
    load: Load | None = None
    began = time.monotonic()
    try:
        system.start_hub()
        system.start_clusters()
        system.start_haproxy()
        for _ in range(2):
            system.start_instance()
        for agent in system.agents:
            system.start_agent(agent)
        system.wait_steady(90)
        load = Load(f"https://{LOOPBACK}:{system.front}", str(system.pki / "gateway" / "ca.crt"),
                    system.user_token, CLUSTERS, plan.watches)
        load.start()
        deadline = time.monotonic() + 60
        while load.open_watches < plan.watches:
            if time.monotonic() > deadline:
                raise RuntimeError(f"only {load.open_watches} watches open: "
                                   f"{Counter(o.outcome for o in load.observations)}")
            time.sleep(0.1)
        print(f"[ha] set up in {time.monotonic() - began:.0f}s: 2 gateways, "
              f"{len(system.agents)} agents, {plan.watches} watches", flush=True)
        runner = Runner(system, load, plan)
        runner.run("rolling_replacement", runner.rolling_replacement)
        runner.run("scale_2_4_2", runner.scale)
        runner.run("sigkill", runner.sigkill)
        runner.run("agent_sigterm", runner.agent_sigterm)
        runner.run("hub_outage", runner.hub_outage)
        results = {e.name: summarize(e, load) for e in runner.events}
    except BaseException:
        print(f"[ha] failed; logs in {root}", file=sys.stderr)
        args.keep = True
        raise
    finally:
        if load is not None:
            load.stop()
        system.close()
        if not args.keep:
            shutil.rmtree(root, ignore_errors=True)
    verdicts = goals(results, plan)
    report = {
        "mode": "smoke" if args.smoke else "full",
        "plan": plan.__dict__,
        "events": results,
        "goals": verdicts,
        "seconds": round(time.monotonic() - began, 1),
        "machine": {"nproc": _nproc(), "python": platform.python_version(),
                    "haproxy": _first_line([HAPROXY, "-v"])},
    }
    if args.json:
        args.json.write_text(json.dumps(report, indent=1))
    print(table(results))
    for name, verdict in verdicts.items():
        print(f"{'PASS' if verdict['pass'] else 'MISS'}  {name}: {verdict['measured']} "
              f"(goal: {verdict['goal']})")
    if args.keep:
        print(f"[ha] logs in {root}")
    return 0


def _nproc() -> int:
    import os

    return len(os.sched_getaffinity(0))


def _first_line(args: list[str]) -> str | None:
    import subprocess

    with contextlib.suppress(OSError, subprocess.TimeoutExpired):
        done = subprocess.run(args, capture_output=True, text=True, timeout=10)
        return (done.stdout or done.stderr).strip().splitlines()[0]
    return None


if __name__ == "__main__":
    sys.exit(main())
