"""One process holding many simulated agents' tunnel sessions, for ``python -m bench fleet``.

    python -m bench.fleetagents --hub 127.0.0.1:PORT --pki DIR --first 0 --count 2500 \\
        --kubeconfig FILE --status FILE --events FILE [--pace PER_SECOND]

Each simulated cluster is an agent as ``hubproxy agent`` builds it (``gateway.agent.command``),
minus what does not touch the hub: its own certificate and :class:`certs.tls.ReloadingContext`,
its own :class:`tunnel.dialer.HubFanout` of :class:`tunnel.dialer.AgentDialer` (the real dial,
backoff, redial and session code), its own :class:`gateway.agent.agent.Agent` (the target check,
the OPEN's identity turned into ``Impersonate-*`` headers). The agents of one process share one
upstream pool, apiserver access and allow-list (their upstream is one ``bench.upstream``), and
run without the agent's readiness probe and impersonation-profile watch (both talk only to the
managed cluster's apiserver) and without a health port.

Protocol with the benchmark (``bench.fleet``): the process builds every cluster's TLS context,
prints ``fleetagents ready N``, and waits for ``go`` on stdin; then every agent dials at once,
or ``--pace`` agents a second. ``quit`` (or EOF) drains and exits. Meanwhile:

* ``--status FILE`` is rewritten every ``STATUS_INTERVAL`` (write, then rename): how many clusters
  hold a session, and counters (dials, failed dials, sessions ended by why);
* ``--events FILE`` gets one line per cluster that came up or went down, ``<monotonic time>
  <index> up|down [reason]`` (``time.monotonic`` is the machine's CLOCK_MONOTONIC, the same in
  every process), so the benchmark can tell which clusters were back when a request was sent.

A cluster is *up* from the moment one of its dialers adopts a session the hub accepted (its
SETTINGS arrived) until its last such session closes.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import logging
import os
import random
import secrets
import sys
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bench.fleetpki import cluster_name

STATUS_INTERVAL = 0.25
SLOWED_WATCH_INTERVAL = 2.0  # seconds; see slow_session_watch()
log = logging.getLogger("bench.fleetagents")


@dataclass
class Counters:
    up: int = 0  # clusters with at least one session
    sessions: int = 0
    dials: int = 0
    failed_dials: int = 0
    ended: Counter[str] = field(default_factory=Counter)  # sessions ended, by reason
    events: list[str] = field(default_factory=list)  # not yet written to --events


@dataclass
class ClusterState:
    index: int
    counters: Counters
    sessions: set[Any] = field(default_factory=set)

    def adopt(self, session: Any) -> None:
        if session in self.sessions or session.closed:
            return
        self.sessions.add(session)
        self.counters.sessions += 1
        if len(self.sessions) == 1:
            self.counters.up += 1
            self.counters.events.append(f"{time.monotonic():.4f} {self.index} up")
        session.on_closed.append(self.lost)

    def lost(self, session: Any) -> None:
        if session not in self.sessions:
            return
        self.sessions.discard(session)
        self.counters.sessions -= 1
        reason = _reason(session.close_reason)
        self.counters.ended[reason] += 1
        if not self.sessions:
            self.counters.up -= 1
            self.counters.events.append(f"{time.monotonic():.4f} {self.index} down {reason}")


def _reason(text: str) -> str:
    """A short, countable reason ("peer dead", "connection lost", ...)."""
    text = (text or "closed").strip()
    if text.startswith("peer dead"):
        return "peer dead"
    return text.split(":")[0][:40].replace(" ", "_") or "closed"


def slow_session_watch() -> str | None:
    """Today's dialer checks each session every ``WATCH_INTERVAL`` (0.5 s): at 10,000 agents in
    a few processes that alone needs about two cores, which real agents (one per cluster) never
    pay together. Slowed to 2 s here, as issue 22's figures were taken; a dialer without that
    poll (event-driven) is left alone. Returns what was done, to print."""
    import tunnel.dialer as dialer

    interval = getattr(dialer, "WATCH_INTERVAL", None)
    if isinstance(interval, int | float) and interval < SLOWED_WATCH_INTERVAL:
        dialer.WATCH_INTERVAL = SLOWED_WATCH_INTERVAL  # type: ignore[attr-defined]
        return (f"tunnel.dialer.WATCH_INTERVAL slowed from {interval:g} s to "
                f"{SLOWED_WATCH_INTERVAL:g} s in the simulated agents")
    return None


def build_agents(args: argparse.Namespace, counters: Counters) -> list[tuple[Any, ClusterState]]:
    """One (HubFanout, ClusterState) per cluster; nothing dials yet."""
    from certs.tls import TLS1_3, ReloadingContext, client_context
    from gateway.agent.agent import Agent
    from gateway.agent.command import tunnel_alpn
    from gateway.agent.kubeapi import load
    from gateway.agent.pool import UpstreamPool
    from gateway.ops.version import pack_release, version
    from tunnel.connection import SessionConfig
    from tunnel.dialer import AgentDialer, HubFanout
    from tunnel.policy import TargetPolicy

    class TrackedDialer(AgentDialer):
        """The real dialer; its ``session`` attribute also reports to the cluster's state."""

        def __init__(self, state: ClusterState, *args: Any, **kwargs: Any) -> None:
            self.state = state  # before the base class sets ``session``
            super().__init__(*args, **kwargs)

        @property  # type: ignore[override]
        def session(self) -> Any:
            return self.__dict__.get("_tracked_session")

        @session.setter
        def session(self, value: Any) -> None:
            self.__dict__["_tracked_session"] = value
            if value is not None:
                self.state.adopt(value)

        async def _connect(self, context: Any) -> Any:
            counters.dials += 1
            session = await super()._connect(context)
            if session is None:
                counters.failed_dials += 1
            return session

    kube = load(kubeconfig=args.kubeconfig)
    policy = TargetPolicy(kube_api=(kube.host, kube.port))
    pool = UpstreamPool(max_connections=args.max_upstream_connections)
    host, _, port = args.hub.rpartition(":")
    pki = Path(args.pki)
    ca = pki / "tunnel-ca" / "ca.crt"
    version_packed = pack_release(version())
    out = []
    for index in range(args.first, args.first + args.count):
        name = cluster_name(index)
        directory = pki / "agents" / name
        cert, key = directory / "tls.crt", directory / "tls.key"
        hub_tls = ReloadingContext(
            lambda cert=cert, key=key: client_context(ca, cert, key, min_version=TLS1_3,
                                                      alpn_protocols=tunnel_alpn()),
            [cert, key, ca])
        agent = Agent(cluster=name, policy=policy, kube=kube, pool=pool)
        state = ClusterState(index, counters)
        instance = secrets.randbits(32) or 1
        config = SessionConfig(agent_version=version_packed, agent_instance=instance)

        def make(fanout: Any, hub_tls: Any = hub_tls, agent: Any = agent,
                 state: ClusterState = state, config: Any = config) -> Any:
            return TrackedDialer(state, host, int(port), hub_tls.current, agent.on_open, config,
                                 server_hostname=host, fanout=fanout)

        out.append((HubFanout(make), state))
    return out


def write_status(path: Path, counters: Counters, clusters: int, notes: list[str]) -> None:
    status = {"pid": os.getpid(), "clusters": clusters, "up": counters.up,
              "sessions": counters.sessions, "dials": counters.dials,
              "failed_dials": counters.failed_dials, "ended": dict(counters.ended),
              "notes": notes, "at": time.monotonic()}
    partial = path.with_suffix(".tmp")
    partial.write_text(json.dumps(status))
    partial.replace(path)


async def run(args: argparse.Namespace) -> int:
    from gateway.ops import gctune
    from gateway.ops.rlimits import raise_open_file_limit

    notes = []
    limit = raise_open_file_limit(args.count + 512)
    if limit < args.count + 512:
        notes.append(f"open-file limit {limit} is below {args.count} sessions + 512")
    slowed = slow_session_watch()
    if slowed:
        notes.append(slowed)
    counters = Counters()
    agents = build_agents(args, counters)
    status, events = Path(args.status), Path(args.events)
    write_status(status, counters, args.count, notes)
    gctune.settle()
    loop = asyncio.get_running_loop()
    reader = asyncio.StreamReader()
    await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), sys.stdin)
    print(f"fleetagents ready {len(agents)}", flush=True)
    if (await reader.readline()).strip() != b"go":
        return 0
    tasks: list[asyncio.Task[None]] = []
    started = time.monotonic()

    async def start_all() -> None:
        # Paced: evenly spaced; at once: every agent's first dial in this loop turn.
        order = list(agents)
        random.shuffle(order)
        for position, (fanout, _) in enumerate(order):
            if args.pace:
                delay = position / args.pace - (time.monotonic() - started)
                if delay > 0:
                    await asyncio.sleep(delay)
            tasks.append(loop.create_task(fanout.run()))

    async def report() -> None:
        with events.open("a") as out:
            while True:
                if counters.events:
                    lines, counters.events[:] = list(counters.events), []
                    out.write("\n".join(lines) + "\n")
                    out.flush()
                write_status(status, counters, args.count, notes)
                await asyncio.sleep(STATUS_INTERVAL)

    starter = loop.create_task(start_all())
    reporter = loop.create_task(report())
    await reader.readline()  # "quit" or EOF
    starter.cancel()
    with contextlib.suppress(Exception):
        await asyncio.wait_for(asyncio.gather(*(f.drain(1.0) for f, _ in agents),
                                              return_exceptions=True), 5)
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)
    reporter.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await reporter
    if counters.events:
        with events.open("a") as out:
            out.write("\n".join(counters.events) + "\n")
    write_status(status, counters, args.count, notes)
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.fleetagents",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("--hub", required=True, help="the gateway's tunnel HOST:PORT")
    parser.add_argument("--pki", required=True, help="bench.fleetpki's layout root")
    parser.add_argument("--first", type=int, required=True, help="first cluster index")
    parser.add_argument("--count", type=int, required=True, help="clusters in this process")
    parser.add_argument("--kubeconfig", required=True, help="the upstream every agent serves")
    parser.add_argument("--status", required=True, help="status JSON, rewritten")
    parser.add_argument("--events", required=True, help="up/down lines, appended")
    parser.add_argument("--pace", type=float, default=0.0,
                        help="agents starting per second in this process (0: all at once)")
    parser.add_argument("--max-upstream-connections", type=int, default=2048)
    args = parser.parse_args(argv)
    # The dialers' per-attempt warnings would be tens of thousands of lines in a storm: the
    # status file counts them instead.
    logging.basicConfig(level=logging.ERROR, format="%(asctime)s %(name)s %(message)s")
    try:
        import uvloop
    except ImportError:
        return asyncio.run(run(args))
    return uvloop.run(run(args))


if __name__ == "__main__":
    sys.exit(main())
