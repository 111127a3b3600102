"""``python -m bench fleet``: one gateway process and N clusters' agents (issue 22).

What runs, all on 127.0.0.1 with real TLS on every hop:

* a real hub (:mod:`bench.fleetkube`): etcd + kube-apiserver, ``deploy/ocm`` (and so
  ``deploy/hub``) RBAC, the ClusterProfile and OCM CRDs, a ClusterProfile and a
  ManagedClusterAddOn for every cluster;
* one ``hubproxy gateway`` process with its instance Lease (``--lease-namespace``), its
  ClusterProfile writer (``--clusterprofiles=on``) and its add-on condition writer
  (``--ocm-addon-conditions``) on, TokenReview against the hub (``--authorize none`` unless
  ``--authorize sar``: one SubjectAccessReview per user and cluster is a hub cost of its own);
* ``--agent-processes`` (4) processes of :mod:`bench.fleetagents`, each holding N/4 agents'
  sessions with their own certificates (:mod:`bench.fleetpki`, cached on disk), every stream
  served by the agent's own code toward one ``bench.upstream`` (a ~1 KiB Pod);
* steady GETs to random clusters through the front door with a real hub token, and a closed
  loop of ``wrk`` c=16 for latency (:mod:`bench.fleetload`).

The run, per N: every agent dials at once (or ``--pace``) → all connected; RSS; the closed
loop; idle CPU (no requests); ``/metrics`` and ``/clusters`` scraped; until every ClusterProfile
and add-on condition is right; then the reconnect storm: SIGKILL of the gateway and a new one on
the same ports, until every cluster is back and every object is right again. Every step is
bounded in time: a fleet that does not form within ``--deadline`` is reported with how many
connected (a MISS), never waited for. Figures, goals and the table: :mod:`bench.fleetreport`.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import shutil
import signal
import statistics
import sys
import tempfile
import threading
import time
import urllib.parse
import urllib.request
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

import yaml

from bench import fleetpki, fleetreport
from bench.fleetkube import Hub
from bench.fleetload import closed_loop
from bench.procs import LOOPBACK, Proc, Procs, free_port
from bench.procstats import cpu_seconds, status_kib

WRK = shutil.which("wrk")
SIZES = (100, 1000, 3000, 10000)


@dataclass(frozen=True)
class Plan:
    clusters: int = 1000
    agent_processes: int = 4
    pace: float = 0.0  # agents dialling per second, all processes together; 0: all at once
    steady_rate: float = 50.0  # steady GETs per second
    closed_connections: int = 16
    closed_seconds: float = 10.0
    idle_seconds: float = 30.0
    settle: float = 5.0  # after all connected, before measuring
    deadline: float = 300.0  # for the fleet to form, and again to come back after the restart
    converge_deadline: float = 180.0  # for every ClusterProfile and condition to be right
    authorize: str = "none"
    hub_writers: bool = True  # the ClusterProfile and add-on condition writers
    metrics_scrapes: int = 3

    @staticmethod
    def smoke() -> Plan:
        return Plan(clusters=200, steady_rate=40.0, closed_seconds=2.0, idle_seconds=3.0,
                    settle=1.0, deadline=60.0, converge_deadline=60.0, metrics_scrapes=1)


# --- helpers ---------------------------------------------------------------------------------

def http_get(port: int, path: str, timeout: float = 30.0) -> tuple[int, bytes, float]:
    """(status, body, seconds until the last byte) of a plain-HTTP GET on the health port."""
    started = time.monotonic()
    try:
        with urllib.request.urlopen(f"http://{LOOPBACK}:{port}{path}", timeout=timeout) as r:
            body = r.read()
            return r.status, body, time.monotonic() - started
    except OSError as exc:
        return 0, str(exc).encode(), time.monotonic() - started


def listen_overflows() -> dict[str, int]:
    """The kernel's TcpExt ListenOverflows and ListenDrops (this network namespace)."""
    lines = Path("/proc/net/netstat").read_text().splitlines()
    for names, values in zip(lines[::2], lines[1::2], strict=False):
        if names.startswith("TcpExt:"):
            table = dict(zip(names.split()[1:], values.split()[1:], strict=True))
            return {k: int(table.get(k, 0)) for k in ("ListenOverflows", "ListenDrops")}
    return {}


def delta(after: dict[str, int], before: dict[str, int]) -> dict[str, int]:
    return {k: after[k] - before.get(k, 0) for k in after}


def hub_write_limit() -> dict[str, float] | None:
    """The gateway's default hub write rate (``--hub-write-qps``, ``--hub-write-burst``), which
    the benchmark leaves as is; None from a gateway without one."""
    from gateway.hub import config

    qps = getattr(config, "DEFAULT_HUB_WRITE_QPS", None)
    burst = getattr(config, "DEFAULT_HUB_WRITE_BURST", None)
    return None if qps is None or burst is None else {"qps": qps, "burst": burst}


def metric_lines(text: str, prefix: str) -> dict[str, float]:
    """Every sample whose series name starts with ``prefix``: ``name{labels}`` -> value."""
    out = {}
    for line in text.splitlines():
        if line.startswith(prefix):
            key, _, value = line.rpartition(" ")
            with contextlib.suppress(ValueError):
                out[key] = float(value)
    return out


class Convergence:
    """Polls the hub in a thread, from :meth:`start` until :meth:`stop`: how many ClusterProfiles
    carry our entry and how many add-ons say TunnelConnected=True, sample by sample, so a dip
    (entries removed, then written again) is seen while it lasts."""

    def __init__(self, hub: Hub, clusters: int, public_url: str, enabled: bool = True) -> None:
        self.enabled = enabled  # without the gateway's writers there is nothing to watch
        self.hub = hub
        self.clusters = clusters
        self.public_url = public_url
        self.interval = max(1.0, clusters / 1000)  # one check LISTs 2N objects
        self.samples: list[tuple[float, int, int]] = []
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.since = 0.0

    def start(self, since: float) -> None:
        self.since, self.samples = since, []
        if not self.enabled:
            return
        self._stop.clear()
        self._thread = threading.Thread(target=self._run, name="fleet-converge", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            right = self.hub.check_fleet(self.clusters, self.public_url)
            self.samples.append((time.monotonic(), right["profiles"], right["addons"]))
            self._stop.wait(self.interval)

    def right(self) -> bool:
        """The last sample has everything right."""
        return bool(self.samples) and min(self.samples[-1][1:]) >= self.clusters

    def wait_right(self, deadline: float) -> None:
        """Until a sample taken now or later is all right, or ``deadline``."""
        asked = time.monotonic()
        while self.enabled and time.monotonic() < deadline:
            if self.samples and self.samples[-1][0] >= asked and self.right():
                return
            time.sleep(0.2)

    def stop(self) -> dict[str, Any]:
        """Seconds from ``since`` to the first sample from which every later one was right
        (None if the last was not), and the fewest right seen."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(60)
        if not self.enabled:
            return {"seconds": None, "skipped": "the gateway's hub writers were off"}
        seconds = None
        for at, profiles, addons in self.samples:
            if min(profiles, addons) >= self.clusters:
                if seconds is None:
                    seconds = round(at - self.since, 1)
            else:
                seconds = None
        return {"seconds": seconds, "samples": len(self.samples),
                "interval_s": self.interval,
                "fewest": {"profiles": min((s[1] for s in self.samples), default=0),
                           "addons": min((s[2] for s in self.samples), default=0)},
                "last": {"profiles": self.samples[-1][1], "addons": self.samples[-1][2]}
                if self.samples else None}


class Fleet:
    """One run at one N: the processes, the clock marks, and the figures."""

    def __init__(self, root: Path, plan: Plan, pki: Path, notes: list[str]) -> None:
        self.root = root
        self.plan = plan
        self.pki = pki
        self.notes = notes
        self.procs = Procs(root)
        self.hub = Hub(root / "hub")
        self.front, self.tunnel, self.health = free_port(), free_port(), free_port()
        self.public_url = f"https://{LOOPBACK}:{self.front}"
        self.gateway: Proc | None = None
        self.gateways: list[Proc] = []
        self.agents: list[Proc] = []
        self.load: Proc | None = None
        self.marks: dict[str, float] = {}
        self.figures: dict[str, Any] = {}
        self.upstream_kubeconfig = root / "upstream.kubeconfig"
        self.events = fleetreport.EventLog(
            root / f"agents-{number}.events" for number in range(plan.agent_processes))

    # processes ---------------------------------------------------------------------------

    def start_upstream(self) -> None:
        from certs.files import cert_pem, write_pair
        from certs.issue import create_ca, issue_server

        tls = self.root / "upstream-tls"
        tls.mkdir()
        ca = create_ca("bench fleet upstream CA", days=2)
        (tls / "ca.crt").write_bytes(cert_pem(ca.cert))
        write_pair(tls, issue_server(ca, "upstream", ["localhost", LOOPBACK], days=2), ca.cert,
                   force=True)
        port = free_port()
        proc = self.procs.start("upstream", [
            sys.executable, "-m", "bench.upstream", "--listen", f"{LOOPBACK}:{port}",
            "--cert", str(tls / "tls.crt"), "--key", str(tls / "tls.key"), "--workers", "1"])
        proc.wait_for_line("upstream ready on", 30)
        token = self.root / "upstream.token"
        token.write_text("fleet-agent-token")
        token.chmod(0o600)
        self.upstream_kubeconfig.write_text(yaml.safe_dump({
            "apiVersion": "v1", "kind": "Config", "current-context": "up",
            "clusters": [{"name": "up", "cluster": {"server": f"https://{LOOPBACK}:{port}",
                                                    "certificate-authority": str(tls / "ca.crt")}}],
            "users": [{"name": "up", "user": {"tokenFile": str(token)}}],
            "contexts": [{"name": "up", "context": {"cluster": "up", "user": "up"}}]}))
        self.upstream_kubeconfig.chmod(0o600)

    def start_gateway(self) -> Proc:
        """A gateway on the run's fixed ports (the same after a restart)."""
        pki = self.pki
        proc = self.procs.start(f"gateway-{len(self.gateways)}", [
            sys.executable, "-m", "gateway.cli", "gateway",
            "--listen", f"{LOOPBACK}:{self.front}", "--tunnel-listen", f"{LOOPBACK}:{self.tunnel}",
            "--health-listen", f"{LOOPBACK}:{self.health}",
            "--tls-dir", str(pki / "gateway"), "--tunnel-tls-dir", str(pki / "tunnel-server"),
            "--agent-ca", str(pki / "tunnel-ca" / "ca.crt"),
            "--hub-kubeconfig", str(self.hub.gateway_kubeconfig),
            "--authorize", self.plan.authorize, "--lease-namespace", "hubproxy",
            *(("--clusterprofiles", "on", "--public-url", self.public_url,
               "--ocm-addon-conditions") if self.plan.hub_writers else ()),
            "--log-level", "info"])
        self.gateways.append(proc)
        self.gateway = proc
        return proc

    def wait_gateway_ready(self, proc: Proc) -> None:
        proc.wait_for_line("hubproxy gateway ready", 60)

    def start_agents(self) -> None:
        plan = self.plan
        share, extra = divmod(plan.clusters, plan.agent_processes)
        first = 0
        for number in range(plan.agent_processes):
            count = share + (1 if number < extra else 0)
            if count == 0:
                continue
            pace = plan.pace * count / plan.clusters if plan.pace else 0.0
            self.agents.append(self.procs.start(f"agents-{number}", [
                sys.executable, "-m", "bench.fleetagents", "--hub", f"{LOOPBACK}:{self.tunnel}",
                "--pki", str(self.pki), "--first", str(first), "--count", str(count),
                "--kubeconfig", str(self.upstream_kubeconfig),
                "--status", str(self.root / f"agents-{number}.status.json"),
                "--events", str(self.root / f"agents-{number}.events"),
                "--pace", f"{pace:g}"], pipe_stdin=True))
            first += count
        for proc in self.agents:
            proc.wait_for_line("fleetagents ready", 120 + plan.clusters / 50)

    def start_load(self) -> None:
        token = self.root / "user.token"
        fd = os.open(token, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as out:
            out.write(self.hub.user_token)
        self.load = self.procs.start("load", [
            sys.executable, "-m", "bench.fleetload", "--url", self.public_url,
            "--ca", str(self.pki / "gateway" / "ca.crt"), "--token-file", str(token),
            "--clusters", str(self.plan.clusters), "--out", str(self.root / "load.json")],
            pipe_stdin=True)
        self.load.wait_for_line("fleetload ready", 30)

    def set_rate(self, rate: float) -> None:
        assert self.load is not None
        self.load.send(f"rate {rate:g}")

    # what the agents say ------------------------------------------------------------------

    def agent_status(self) -> list[dict[str, Any]]:
        out = []
        for number in range(len(self.agents)):
            with contextlib.suppress(OSError, ValueError):
                out.append(json.loads(
                    (self.root / f"agents-{number}.status.json").read_text()))
        return out

    def up(self) -> int:
        return sum(s.get("up", 0) for s in self.agent_status())

    def counters(self) -> dict[str, int]:
        """The agents' dials and failed dials so far, summed over the processes."""
        status = self.agent_status()
        return {k: sum(s.get(k, 0) for s in status) for k in ("dials", "failed_dials")}

    def wait_up(self, want: int, since: float, deadline: float, what: str) -> int:
        """Until ``want`` clusters hold a session that came up since ``since`` (monotonic), or
        until ``deadline``; how many do."""
        last_print = 0.0
        self.events.poll()
        up = self.events.up_since(since)
        while up < want and time.monotonic() < deadline:
            for proc in self.agents:
                if not proc.alive():
                    raise RuntimeError(f"{proc.name} exited:\n{proc.output()}")
            if self.gateway is not None and not self.gateway.alive():
                raise RuntimeError(f"the gateway exited:\n{self.gateway.output()}")
            if time.monotonic() - last_print >= 10:
                print(f"[fleet] {what}: {up}/{want} connected", flush=True)
                last_print = time.monotonic()
            time.sleep(0.25)
            self.events.poll()
            up = self.events.up_since(since)
        return up

    def agent_cpu(self) -> float:
        return sum(cpu_seconds(p.pid) for p in self.agents)

    def hub_cpu(self) -> float:
        """etcd + kube-apiserver: they share the machine's cores with the gateway."""
        return sum(cpu_seconds(pid) for pid in self.hub.pids)

    # measurements -------------------------------------------------------------------------

    def gateway_pid(self) -> int:
        assert self.gateway is not None
        return self.gateway.pid

    def scrape(self, path: str, times: int) -> dict[str, Any]:
        runs = [http_get(self.health, path) for _ in range(times)]
        seconds = [r[2] for r in runs]
        return {"status": runs[-1][0], "bytes": len(runs[-1][1]),
                "seconds_median": round(statistics.median(seconds), 3),
                "seconds_max": round(max(seconds), 3), "body": runs[-1][1]}

    def scrape_clusters(self) -> dict[str, Any]:
        """``/clusters`` as the gateway answers it by default, and whole: pages followed by
        ``metadata.continue`` when it paginates."""
        first = self.scrape("/clusters", 1)
        body = first.pop("body")
        pages, total_bytes, total_s = 1, first["bytes"], first["seconds_max"]
        while pages < 1000:
            with contextlib.suppress(ValueError, AttributeError):
                token = (json.loads(body).get("metadata") or {}).get("continue")
                if token:
                    status, body, seconds = http_get(
                        self.health, f"/clusters?continue={urllib.parse.quote(token)}")
                    pages, total_bytes, total_s = pages + 1, total_bytes + len(body), \
                        total_s + seconds
                    if status == 200:
                        continue
            break
        return {**first, "pages": pages, "all_bytes": total_bytes,
                "all_seconds": round(total_s, 3)}

    # the run --------------------------------------------------------------------------------

    def run(self) -> dict[str, Any]:
        plan, marks, figures = self.plan, self.marks, self.figures
        n = plan.clusters
        began = time.monotonic()
        self.hub.start()
        figures["hub_objects_s"] = round(self.hub.create_fleet(n), 1)
        figures["hub_write_limit"] = hub_write_limit()
        print(f"[fleet] N={n}: hub ready with {n} ClusterProfiles and add-ons in "
              f"{time.monotonic() - began:.0f}s", flush=True)
        self.start_upstream()
        gateway = self.start_gateway()
        self.wait_gateway_ready(gateway)
        self.start_agents()
        self.start_load()
        for status in self.agent_status():
            for note in status.get("notes", []):
                if note not in self.notes:
                    self.notes.append(note)
        time.sleep(1.0)
        figures["gateway_rss_before_mib"] = round(status_kib(gateway.pid, "VmRSS") / 1024, 1)
        self.set_rate(plan.steady_rate)

        # 1. every agent dials
        overflows = listen_overflows()
        cpu0, agent_cpu0, hub_cpu0 = cpu_seconds(gateway.pid), self.agent_cpu(), self.hub_cpu()
        marks["go"] = time.monotonic()
        dials = self.counters()
        converge = Convergence(self.hub, n, self.public_url, plan.hub_writers)
        converge.start(marks["go"])
        for proc in self.agents:
            proc.send("go")
        up = self.wait_up(n, marks["go"], marks["go"] + plan.deadline, "start")
        marks["formed"] = time.monotonic()
        figures["connect"] = {
            "connected": up, "seconds": round(marks["formed"] - marks["go"], 1),
            "gateway_cpu_s": round(cpu_seconds(gateway.pid) - cpu0, 1),
            "agents_cpu_s": round(self.agent_cpu() - agent_cpu0, 1),
            "hub_cpu_s": round(self.hub_cpu() - hub_cpu0, 1),
            "agent_dials": delta(self.counters(), dials),
            "listen_overflows": delta(listen_overflows(), overflows)}
        print(f"[fleet] N={n}: {up}/{n} connected after {marks['formed'] - marks['go']:.1f}s",
              flush=True)
        time.sleep(plan.settle)

        # 2. memory and the closed loop
        figures["gateway_rss_mib"] = round(status_kib(gateway.pid, "VmRSS") / 1024, 1)
        figures["agents_rss_mib"] = round(
            sum(status_kib(p.pid, "VmRSS") for p in self.agents) / 1024, 1)
        figures["connected_after_settle"] = self.up()
        if WRK is not None:
            cpu0 = cpu_seconds(gateway.pid)
            marks["closed_start"] = time.monotonic()
            summary = closed_loop(WRK, self.public_url, self.hub.user_token, n, self.root,
                                     connections=plan.closed_connections,
                                     seconds=plan.closed_seconds)
            marks["closed_end"] = time.monotonic()
            gateway_cpu = cpu_seconds(gateway.pid) - cpu0
            summary["gateway_cpu_s_per_10k"] = round(
                gateway_cpu / max(1, summary["requests"]) * 10000, 2)
            figures["closed_loop"] = summary

        # 3. idle: no requests at all
        self.set_rate(0)
        time.sleep(2.0)
        cpu0, agent_cpu0, hub_cpu0 = cpu_seconds(gateway.pid), self.agent_cpu(), self.hub_cpu()
        marks["idle_start"] = time.monotonic()
        time.sleep(plan.idle_seconds)
        marks["idle_end"] = time.monotonic()
        seconds = marks["idle_end"] - marks["idle_start"]
        hub = self.hub.gateway_requests(marks["idle_start"], marks["idle_end"])
        figures["idle"] = {
            "seconds": round(seconds, 1),
            "gateway_cpu_pct": round(100 * (cpu_seconds(gateway.pid) - cpu0) / seconds, 2),
            "agents_cpu_pct": round(100 * (self.agent_cpu() - agent_cpu0) / seconds, 2),
            "hub_cpu_pct": round(100 * (self.hub_cpu() - hub_cpu0) / seconds, 2),
            # The gateway's own hub traffic while no request arrives (writers' resyncs, Lease).
            "hub_requests_per_s": round((hub["writes"] + hub["reads"]) / seconds, 1),
            "hub_requests": {**hub["writes_by_resource"], **hub["reads_by_resource"]}}
        self.set_rate(plan.steady_rate)

        # 4. the health port at this size, then the hub's view
        metrics = self.scrape("/metrics", plan.metrics_scrapes)
        text = metrics.pop("body").decode(errors="replace")
        figures["metrics"] = {**metrics, "series": sum(
            1 for line in text.splitlines() if line and not line.startswith("#"))}
        figures["gateway_connected_clusters"] = metric_lines(
            text, "hubproxy_connected_clusters").get("hubproxy_connected_clusters")
        figures["clusters_endpoint"] = self.scrape_clusters()
        converge.wait_right(marks["go"] + plan.converge_deadline)
        figures["converge_start"] = converge.stop()
        marks["converged"] = time.monotonic()
        figures["hub_start"] = self.hub.gateway_requests(marks["go"], marks["converged"])

        # 5. the reconnect storm: SIGKILL, a new gateway on the same ports
        time.sleep(plan.settle)
        overflows = listen_overflows()
        marks["kill"] = time.monotonic()
        gateway.popen.send_signal(signal.SIGKILL)
        gateway.popen.wait(30)
        marks["restart"] = time.monotonic()
        agent_cpu0, dials, hub_cpu0 = self.agent_cpu(), self.counters(), self.hub_cpu()
        converge.start(marks["restart"])
        gateway = self.start_gateway()
        up = self.wait_up(n, marks["restart"], marks["restart"] + plan.deadline, "storm")
        marks["back"] = time.monotonic()
        figures["storm"] = {
            "connected": up, "seconds": round(marks["back"] - marks["restart"], 1),
            "kill_to_restart_s": round(marks["restart"] - marks["kill"], 2),
            "gateway_cpu_s": round(cpu_seconds(gateway.pid), 1),
            "agents_cpu_s": round(self.agent_cpu() - agent_cpu0, 1),
            "hub_cpu_s": round(self.hub_cpu() - hub_cpu0, 1),
            "agent_dials": delta(self.counters(), dials),
            "listen_overflows": delta(listen_overflows(), overflows)}
        print(f"[fleet] N={n}: {up}/{n} back {marks['back'] - marks['restart']:.1f}s after "
              "the restart", flush=True)
        converge.wait_right(marks["restart"] + plan.converge_deadline)
        figures["converge_storm"] = converge.stop()
        marks["storm_end"] = time.monotonic()
        figures["hub_storm"] = self.hub.gateway_requests(marks["restart"], marks["storm_end"])
        text = http_get(self.health, "/metrics")[1].decode(errors="replace")
        figures["storm"]["handshakes"] = metric_lines(text, "hubproxy_tunnel_handshake")
        figures["storm"]["refused"] = metric_lines(text, "hubproxy_tunnel_refused")
        figures["gateway_dead_declared"] = [
            fleetreport.dead_declared(p.log.read_text(errors="replace")) for p in self.gateways]
        figures["agents"] = self.agent_status()
        figures["seconds"] = round(time.monotonic() - began, 1)
        return self.finish()

    def finish(self) -> dict[str, Any]:
        if self.load is not None:
            self.load.send("quit")
            with contextlib.suppress(Exception):
                self.load.popen.wait(60)
        for proc in self.agents:
            proc.send("quit")
        for proc in self.agents:
            with contextlib.suppress(Exception):
                proc.popen.wait(30)
        load = json.loads((self.root / "load.json").read_text())
        events = self.events.all_events()
        return fleetreport.summarize(self.plan, self.marks, self.figures, load, events)

    def close(self) -> None:
        self.procs.stop_all()
        self.hub.stop()


# --- main --------------------------------------------------------------------------------------

def run_one(plan: Plan, notes: list[str], keep: bool) -> dict[str, Any]:
    pki, issued = fleetpki.ensure(plan.clusters)
    if issued:
        print(f"[fleet] issued {issued} agent certificates into {pki}", flush=True)
    root = Path(tempfile.mkdtemp(prefix=f"bench-fleet-{plan.clusters}-"))
    fleet = Fleet(root, plan, pki, notes)
    try:
        result = fleet.run()
    except BaseException:
        print(f"[fleet] failed; logs in {root}", file=sys.stderr)
        keep = True
        raise
    finally:
        fleet.close()
        if not keep:
            shutil.rmtree(root, ignore_errors=True)
    if keep:
        result["logs"] = str(root)
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench fleet", description=__doc__.split(
        "\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--clusters", default="",
                        help="N, or a comma-separated series run one after the other "
                        f"(default {','.join(map(str, SIZES))}); the first is the p99 baseline")
    parser.add_argument("--smoke", action="store_true",
                        help="N=200 with short windows (what the test suite runs, ~60 s)")
    parser.add_argument("--agent-processes", type=int, help="processes holding the agents "
                        "(default 4)")
    parser.add_argument("--pace", type=float, help="agents dialling per second (default: "
                        "all at once)")
    parser.add_argument("--rate", type=float, help="steady GETs per second (default 50)")
    parser.add_argument("--idle-seconds", type=float, help="idle CPU window (default 30)")
    parser.add_argument("--deadline", type=float,
                        help="seconds for the fleet to form or come back (default 300)")
    parser.add_argument("--authorize", choices=("none", "sar"),
                        help="the gateway's --authorize (default none: TokenReview only)")
    parser.add_argument("--no-hub-writers", action="store_true",
                        help="run the gateway without its ClusterProfile and add-on condition "
                        "writers (to tell their cost from the tunnel's; the instance Lease "
                        "stays)")
    parser.add_argument("--baseline", type=Path,
                        help="an earlier --json whose first run's p99 is the baseline")
    parser.add_argument("--json", type=Path, help="write every figure here")
    parser.add_argument("--keep", action="store_true", help="keep the work directories (logs)")
    args = parser.parse_args(argv)
    missing = fleetreport.missing_tools()
    if missing:
        print(f"bench fleet cannot run here: {missing}", file=sys.stderr)
        return 2
    base = Plan.smoke() if args.smoke else Plan()
    overrides = {k: v for k, v in (
        ("agent_processes", args.agent_processes), ("pace", args.pace),
        ("steady_rate", args.rate), ("idle_seconds", args.idle_seconds),
        ("deadline", args.deadline), ("authorize", args.authorize),
        ("hub_writers", False if args.no_hub_writers else None)) if v is not None}
    base = replace(base, **overrides)
    sizes = [int(x) for x in args.clusters.split(",") if x.strip()] or (
        [base.clusters] if args.smoke else list(SIZES))
    notes: list[str] = []
    limit = fleetreport.nofile_limit()
    if limit < max(sizes) + 1024:
        notes.append(f"the open-file hard limit ({limit}) is below {max(sizes)} sessions + 1024: "
                     "the gateway cannot hold them all")
    began = time.monotonic()
    runs = []
    for size in sizes:
        plan = replace(base, clusters=size)
        runs.append({"plan": asdict(plan), **run_one(plan, notes, args.keep)})
    baseline = fleetreport.baseline_p99(runs, args.baseline)
    for run in runs:
        run["goals"] = fleetreport.goals(run, baseline)
    report = {"mode": "smoke" if args.smoke else "full", "runs": runs, "notes": notes,
              "baseline_p99_ms": baseline, "seconds": round(time.monotonic() - began, 1),
              "machine": {"nproc": len(os.sched_getaffinity(0)),
                          "python": platform.python_version(),
                          "nofile": fleetreport.nofile_limit()}}
    if args.json:
        args.json.write_text(json.dumps(report, indent=1))
    print(fleetreport.table(runs))
    for note in notes:
        print(f"note: {note}")
    for run in runs:
        for name, verdict in run["goals"].items():
            mark = {True: "PASS", False: "MISS", None: "n/a "}[verdict["pass"]]
            print(f"{mark}  N={run['clusters']:,} {name}: {verdict['measured']} "
                  f"(goal: {verdict['goal']})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
