"""What N agent sessions cost one hub process: memory, idle CPU, admission, storms (issue 22).

    python -m bench.tunnelidle --clusters N [--hub gateway|listener|floor] [--agent-procs K]
                               [--pace R] [--idle S] [--storm] [--json FILE]

The tunnel-level measurement behind the ``fleet-tunnel`` figures (``python -m bench fleet``
measures the whole gateway with its hub writers and requests). On 127.0.0.1:

* the hub is one process: a real ``hubproxy gateway`` (``--hub gateway``, with kubesim as the
  hub apiserver for its TokenReviews), only the tunnel listener and its registry
  (``--hub listener``), or, for the floor, a bare uvloop TLS server with the same certificate
  and client-certificate check holding connections that do nothing (``--hub floor``);
* ``K`` agent processes hold ``N / K`` agents' sessions each, every agent with its own
  certificate (issued once and cached under ``--pki``), dialled by the real
  :class:`tunnel.dialer.HubFanout`/``AgentDialer`` with the defaults ``hubproxy agent`` uses
  (in ``--hub floor`` mode, bare TLS connections that send one small message and wait).

Phases: every agent dials at once (or ``--pace R`` agents a second); the time until all are
connected and the hub's CPU seconds per admitted agent; then, settled, the hub's RSS per
session (against its RSS before any agent) and the hub's and agents' CPU over ``--idle``
seconds; with ``--storm``, SIGKILL the hub and start it again on the same port: the time until
all are back and the hub's CPU per agent readmitted. One JSON document on stdout (or
``--json``), a short table on stderr. Measured figures are in bench/README.md ("tunnelidle").
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path
from typing import Any

from bench.procs import LOOPBACK, Procs, free_port
from bench.procstats import cpu_seconds, rss_mib

CLUSTER_PREFIX = "fleet-"
STATUS_INTERVAL = 0.25  # seconds between an agent process's status lines


def cluster_name(i: int) -> str:
    return f"{CLUSTER_PREFIX}{i:05d}"


def ensure_pki(root: Path, clusters: int) -> Path:
    """``hubproxy certs init`` layout with ``clusters`` agent certificates (cached: issued once
    for the largest count asked so far)."""
    from certs import layout

    marker = root / "clusters"
    if marker.exists() and int(marker.read_text()) >= clusters:
        return root
    started = time.monotonic()
    log(f"issuing {clusters} agent certificates into {root} (once)")
    layout.init(root, layout.InitOptions(clusters=[cluster_name(i) for i in range(clusters)],
                                         force=True))
    marker.write_text(str(clusters))
    log(f"  done in {time.monotonic() - started:.0f}s")
    return root


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


# The agent processes --------------------------------------------------------------------------

class _Echo:
    """Agent-side stream: accept and echo (the tool opens none; a hub probe may)."""

    def connection_made(self, stream: Any) -> None:
        self.stream = stream
        stream.accept()

    def data_received(self, data: bytes | memoryview) -> None:
        self.stream.write(bytes(data))

    def eof_received(self) -> None:
        self.stream.write_eof()

    def connection_lost(self, exc: object) -> None:
        pass

    def pause_writing(self) -> None:
        pass

    def resume_writing(self) -> None:
        pass


async def run_agents(port: int, pki: Path, first: int, count: int, pace: float,
                     bare: bool, keepalive: float | None) -> None:
    """``count`` agents (clusters ``first``...), dialling when stdin says GO; status lines."""
    from certs.tls import TLS1_3, ReloadingContext, client_context
    from tunnel import dialer as dialer_module
    from tunnel.connection import ALPN, SessionConfig

    if hasattr(dialer_module, "WATCH_INTERVAL"):
        # Before issue 22 every dialer polled its session every 0.5 s; at thousands of agents
        # per process that alone took the CPU (the issue's own runs slowed it to 2 s too).
        dialer_module.WATCH_INTERVAL = 2.0  # type: ignore[attr-defined]
    loop = asyncio.get_running_loop()
    contexts = []
    for i in range(first, first + count):
        d = pki / "agents" / cluster_name(i)
        files = [d / "tls.crt", d / "tls.key", d / "ca.crt"]

        def build(d: Path = d) -> Any:
            return client_context(d / "ca.crt", d / "tls.crt", d / "tls.key",
                                  min_version=TLS1_3, alpn_protocols=[ALPN])

        contexts.append(build() if bare else ReloadingContext(build, files))
    print("READY", flush=True)
    await loop.run_in_executor(None, sys.stdin.readline)  # GO
    fanouts: list[Any] = []
    held: list[asyncio.StreamWriter] = []
    tasks: set[asyncio.Future[Any]] = set()
    failures = 0

    async def bare_connection(context: Any) -> None:
        nonlocal failures
        while True:
            try:
                reader, writer = await asyncio.open_connection(
                    LOOPBACK, port, ssl=context, server_hostname="localhost",
                    ssl_handshake_timeout=10.0)
                writer.write(b"PING 0123456789\n")
                await reader.read(64)
                held.append(writer)
                return
            except (OSError, asyncio.IncompleteReadError, TimeoutError):
                failures += 1
                await asyncio.sleep(1.0)

    def start(context: Any) -> None:
        if bare:
            task: asyncio.Future[Any] = loop.create_task(bare_connection(context))
        else:
            fanout = dialer_module.HubFanout(lambda f, c=context: dialer_module.AgentDialer(
                LOOPBACK, port, c.current, lambda request: _Echo(),
                SessionConfig() if keepalive is None else SessionConfig(ping_after=keepalive),
                server_hostname="localhost", fanout=f))
            fanouts.append(fanout)
            task = loop.create_task(fanout.run())
        tasks.add(task)

    async def report() -> None:
        while True:
            if bare:
                status = {"connected": len(held), "connects": len(held), "failures": failures}
            else:
                status = {"connected": sum(1 for f in fanouts if f.connected),
                          "connects": sum(f.connects for f in fanouts)}
            print(json.dumps(status), flush=True)
            await asyncio.sleep(STATUS_INTERVAL)

    reporter = loop.create_task(report())
    for n, context in enumerate(contexts):
        start(context)
        if pace > 0:
            await asyncio.sleep(1.0 / pace)
        elif n % 256 == 255:
            await asyncio.sleep(0)
    await loop.run_in_executor(None, sys.stdin.readline)  # STOP
    reporter.cancel()
    for writer in held:
        writer.close()
    for task in tasks:
        task.cancel()


# The hub processes ----------------------------------------------------------------------------

async def serve_listener(port: int, pki: Path, keepalive: float | None) -> None:
    """Only the tunnel: listener + registry, with the gateway's defaults."""
    from certs.tls import TLS1_3, server_context
    from gateway.ops import gctune
    from tunnel.connection import ALPN, SessionConfig
    from tunnel.listener import start_tunnel_listener
    from tunnel.registry import SessionRegistry

    d = pki / "tunnel-server"
    context = server_context(d / "tls.crt", d / "tls.key", pki / "tunnel-ca" / "ca.crt",
                             min_version=TLS1_3, alpn_protocols=[ALPN])
    # None: the listener's own defaults (those of a gateway without --tunnel-keepalive).
    config = None if keepalive is None else SessionConfig(ping_after=keepalive)
    await start_tunnel_listener(LOOPBACK, port, context, SessionRegistry(), config)
    gctune.settle()
    print("hub ready", flush=True)
    await asyncio.Event().wait()


async def serve_floor(port: int, pki: Path) -> None:
    """Bare TLS 1.3 with the tunnel's certificate and client-certificate check: each
    connection answers one small message, then holds nothing but its transport."""
    from bench.tlsfloor import Idle
    from certs.tls import TLS1_3, server_context
    from tunnel.connection import ALPN

    d = pki / "tunnel-server"
    context = server_context(d / "tls.crt", d / "tls.key", pki / "tunnel-ca" / "ca.crt",
                             min_version=TLS1_3, alpn_protocols=[ALPN])
    held: list[asyncio.BaseTransport] = []
    await asyncio.get_running_loop().create_server(lambda: Idle(held), LOOPBACK, port,
                                                   ssl=context, backlog=4096)
    print("hub ready", flush=True)
    await asyncio.Event().wait()


class Hub:
    """The hub process under test (started again on the same ports for the storm)."""

    def __init__(self, kind: str, pki: Path, procs: Procs, work: Path,
                 keepalive: float | None = None) -> None:
        self.kind, self.pki, self.procs, self.work = kind, pki, procs, work
        self.keepalive = keepalive
        self.port = free_port()
        self.health_port = free_port()
        self.front_port = free_port()
        self.proc: Any = None
        self.starts = 0
        self.kubeconfig: Path | None = None
        if kind == "gateway":
            self._start_hub_apiserver()

    def _start_hub_apiserver(self) -> None:
        from bench.configs import Lab, start_hub_stub

        lab = Lab(self.work, self.procs)
        start_hub_stub(lab)
        self.kubeconfig = lab.hub_kubeconfig

    def start(self) -> None:
        self.starts += 1
        name = f"hub-{self.kind}-{self.starts}"
        if self.kind == "gateway":
            assert self.kubeconfig is not None
            args = [sys.executable, "-m", "gateway.cli", "gateway",
                    "--listen", f"{LOOPBACK}:{self.front_port}",
                    "--tunnel-listen", f"{LOOPBACK}:{self.port}",
                    "--health-listen", f"{LOOPBACK}:{self.health_port}",
                    "--tls-dir", str(self.pki / "gateway"),
                    "--tunnel-tls-dir", str(self.pki / "tunnel-server"),
                    "--agent-ca", str(self.pki / "tunnel-ca" / "ca.crt"),
                    "--hub-kubeconfig", str(self.kubeconfig), "--authorize", "none",
                    "--log-level", "warning"]
            if self.keepalive is not None:
                args += ["--tunnel-keepalive", str(self.keepalive)]
            needle = "hubproxy gateway ready"
        else:
            args = [sys.executable, "-m", "bench.tunnelidle", f"--serve-{self.kind}",
                    str(self.port), "--pki", str(self.pki)]
            if self.keepalive is not None:
                args += ["--keepalive", str(self.keepalive)]
            needle = "hub ready"
        self.proc = self.procs.start(name, args)
        self.proc.wait_for_line(needle, 60)

    def kill(self) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.popen.wait(10)

    @property
    def pid(self) -> int:
        return int(self.proc.pid)

    def metrics(self) -> dict[str, float]:
        """The gateway's tunnel counters from /metrics (gateway hub only)."""
        if self.kind != "gateway":
            return {}
        url = f"http://{LOOPBACK}:{self.health_port}/metrics"
        with urllib.request.urlopen(url, timeout=60) as response:
            text = response.read().decode()
        out: dict[str, float] = {}
        for line in text.splitlines():
            if line.startswith("hubproxy_tunnel_") and not line.startswith("#"):
                name, _, value = line.rpartition(" ")
                out[name] = float(value)
        return out


class Agents:
    """The agent processes and what their status lines say."""

    def __init__(self, procs_count: int, clusters: int, port: int, pki: Path, pace: float,
                 bare: bool, logdir: Path, keepalive: float | None = None) -> None:
        self.children: list[subprocess.Popen[str]] = []
        self.status: list[dict[str, int]] = []
        per = -(-clusters // procs_count)
        for k in range(procs_count):
            first, count = k * per, min(per, clusters - k * per)
            if count <= 0:
                break
            child = subprocess.Popen(
                [sys.executable, "-m", "bench.tunnelidle", "--agents", str(port), "--pki",
                 str(pki), "--first", str(first), "--count", str(count),
                 "--pace", str(pace / procs_count), *(["--bare"] if bare else []),
                 *(["--keepalive", str(keepalive)] if keepalive is not None else [])],
                stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
                stderr=open(logdir / f"agents-{k}.log", "wb"),  # noqa: SIM115 (the child's)
                start_new_session=True)
            self.children.append(child)
            self.status.append({"connected": 0, "connects": 0})
        for child in self.children:
            assert child.stdout is not None
            if child.stdout.readline().strip() != "READY":
                raise RuntimeError("an agent process did not start")
        self._readers = [threading.Thread(target=self._read, args=(i,), daemon=True)
                         for i in range(len(self.children))]
        for reader in self._readers:
            reader.start()

    def _read(self, i: int) -> None:
        stdout = self.children[i].stdout
        assert stdout is not None
        for line in stdout:
            with contextlib.suppress(ValueError):
                self.status[i] = json.loads(line)

    @property
    def pids(self) -> list[int]:
        return [c.pid for c in self.children]

    def go(self) -> None:
        for child in self.children:
            assert child.stdin is not None
            child.stdin.write("GO\n")
            child.stdin.flush()

    def connected(self) -> int:
        return sum(s["connected"] for s in self.status)

    def connects(self) -> int:
        return sum(s["connects"] for s in self.status)

    def wait_connected(self, want: int, timeout: float, since: float) -> float | None:
        """Seconds from ``since`` until ``want`` are connected (None: not within timeout)."""
        deadline = since + timeout
        last_report = 0.0
        while time.monotonic() < deadline:
            now = time.monotonic()
            if self.connected() >= want:
                return now - since
            if now - last_report >= 10:
                log(f"  {self.connected()}/{want} connected after {now - since:.0f}s")
                last_report = now
            time.sleep(0.05)
        return None

    def stop(self) -> None:
        for child in self.children:
            with contextlib.suppress(OSError):
                assert child.stdin is not None
                child.stdin.write("STOP\n")
                child.stdin.flush()
        for child in self.children:
            try:
                child.wait(20)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(child.pid, signal.SIGKILL)
                child.wait(5)


def cpu(pids: list[int]) -> float:
    return sum(cpu_seconds(p) for p in pids)


def measure(args: argparse.Namespace) -> dict[str, Any]:
    pki = ensure_pki(Path(args.pki), args.clusters)
    work = Path(tempfile.mkdtemp(prefix="hubproxy-tunnelidle-"))
    procs = Procs(work)
    hub = Hub(args.hub, pki, procs, work, args.hub_keepalive)
    agents: Agents | None = None
    result: dict[str, Any] = {"clusters": args.clusters, "hub": args.hub,
                              "agent_procs": args.agent_procs, "pace": args.pace,
                              "hub_keepalive": args.hub_keepalive,
                              "agent_keepalive": args.agent_keepalive}
    try:
        hub.start()
        time.sleep(2.0)
        rss_before = rss_mib(hub.pid)
        agents = Agents(args.agent_procs, args.clusters, hub.port, pki, args.pace,
                        args.hub == "floor", work, args.agent_keepalive)
        cpu_before = cpu_seconds(hub.pid)
        started = time.monotonic()
        agents.go()
        took = agents.wait_connected(args.clusters, args.timeout, started)
        result["connect_seconds"] = took
        result["connected"] = agents.connected()
        admit_cpu = cpu_seconds(hub.pid) - cpu_before
        result["hub_cpu_seconds_connecting"] = admit_cpu
        result["hub_cpu_ms_per_agent"] = 1000 * admit_cpu / max(1, agents.connects())
        log(f"{result['connected']}/{args.clusters} connected in {took}s; hub CPU "
            f"{result['hub_cpu_ms_per_agent']:.2f} ms per admitted agent")
        time.sleep(args.settle)
        rss_after = rss_mib(hub.pid)
        result["hub_rss_before_mib"] = rss_before
        result["hub_rss_after_mib"] = rss_after
        result["hub_kib_per_session"] = (rss_after - rss_before) * 1024 / max(
            1, result["connected"])
        hub_cpu, agent_cpu = cpu_seconds(hub.pid), cpu(agents.pids)
        time.sleep(args.idle)
        result["idle_seconds"] = args.idle
        result["hub_idle_cpu_percent"] = 100 * (cpu_seconds(hub.pid) - hub_cpu) / args.idle
        result["agents_idle_cpu_percent"] = 100 * (cpu(agents.pids) - agent_cpu) / args.idle
        result["still_connected"] = agents.connected()
        log(f"hub RSS {rss_before:.0f} -> {rss_after:.0f} MiB: "
            f"{result['hub_kib_per_session']:.1f} KiB per session; idle CPU: hub "
            f"{result['hub_idle_cpu_percent']:.1f}%, "
            f"agents {result['agents_idle_cpu_percent']:.1f}%")
        if args.storm and args.hub != "floor":
            connects = agents.connects()
            hub.kill()
            killed = time.monotonic()
            hub.start()
            cpu_before = cpu_seconds(hub.pid)
            # The agents notice the loss within a status line or two: wait for the count to
            # drop before waiting for it to rise again.
            while agents.connected() > args.clusters // 2 and time.monotonic() - killed < 30:
                time.sleep(0.05)
            back = agents.wait_connected(args.clusters, args.timeout, killed)
            result["storm_seconds"] = back
            result["storm_connected"] = agents.connected()
            storm_cpu = cpu_seconds(hub.pid) - cpu_before
            readmitted = max(1, agents.connects() - connects)
            result["storm_hub_cpu_seconds"] = storm_cpu
            result["storm_hub_cpu_ms_per_agent"] = 1000 * storm_cpu / readmitted
            log(f"storm: {result['storm_connected']}/{args.clusters} back {back}s after the "
                f"kill; hub CPU {result['storm_hub_cpu_ms_per_agent']:.2f} ms per agent")
        with contextlib.suppress(OSError):
            result["hub_metrics"] = hub.metrics()
    finally:
        if agents is not None:
            agents.stop()
        procs.stop_all()
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.tunnelidle", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--clusters", type=int, default=1000)
    parser.add_argument("--hub", choices=("gateway", "listener", "floor"), default="gateway")
    parser.add_argument("--agent-procs", type=int, default=4)
    parser.add_argument("--pace", type=float, default=0.0,
                        help="agents starting to dial per second (0: all at once)")
    parser.add_argument("--idle", type=float, default=30.0, help="idle CPU window, seconds")
    parser.add_argument("--settle", type=float, default=5.0)
    parser.add_argument("--timeout", type=float, default=300.0,
                        help="give up waiting for the agents to connect after this long")
    parser.add_argument("--storm", action="store_true",
                        help="then SIGKILL the hub, restart it and time until all are back")
    parser.add_argument("--pki", default=os.path.join(tempfile.gettempdir(),
                                                      "hubproxy-tunnelidle-pki"))
    parser.add_argument("--hub-keepalive", type=float, metavar="SECONDS",
                        help="the hub's --tunnel-keepalive (default: the hub's default)")
    parser.add_argument("--agent-keepalive", type=float, metavar="SECONDS",
                        help="the agents' keepalive (default: the agent's default)")
    parser.add_argument("--json", metavar="FILE")
    # Child processes.
    parser.add_argument("--agents", type=int, metavar="PORT", help=argparse.SUPPRESS)
    parser.add_argument("--first", type=int, default=0, help=argparse.SUPPRESS)
    parser.add_argument("--count", type=int, default=0, help=argparse.SUPPRESS)
    parser.add_argument("--bare", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--serve-listener", type=int, metavar="PORT", help=argparse.SUPPRESS)
    parser.add_argument("--serve-floor", type=int, metavar="PORT", help=argparse.SUPPRESS)
    parser.add_argument("--keepalive", type=float, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)

    import uvloop

    from gateway.ops.rlimits import raise_open_file_limit

    raise_open_file_limit()
    if args.agents:
        uvloop.run(run_agents(args.agents, Path(args.pki), args.first, args.count, args.pace,
                              args.bare, args.keepalive))
        return 0
    if args.serve_listener:
        uvloop.run(serve_listener(args.serve_listener, Path(args.pki), args.keepalive))
        return 0
    if args.serve_floor:
        uvloop.run(serve_floor(args.serve_floor, Path(args.pki)))
        return 0
    result = measure(args)
    text = json.dumps(result, indent=2, sort_keys=True)
    if args.json:
        Path(args.json).write_text(text + "\n")
    print(text, flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
