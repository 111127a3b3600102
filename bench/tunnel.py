"""``python -m bench tunnel``: the tunnel's data path against a plain TLS relay, side by side.

Everything runs on 127.0.0.1 with TLS 1.3 and mutual authentication (certificates from our own
``certs`` package), uvloop when importable, through the production code: ``start_tunnel_listener``
+ ``SessionRegistry`` on the hub, ``AgentDialer`` on the agent, whose ``on_open`` accepts
``TCPTarget`` streams with :class:`Relay` (dial, then accept; raw bytes both ways with
back-pressure). The reference ("plain") path has the same shape without the tunnel: a TLS client
talks to a TLS server that relays with the same :class:`Relay` to the same TCP sink/echo. Both
configurations alternate (A B A B ...) so machine drift hits both.

Measured: single-stream throughput (median of >= 3), 64-stream aggregate throughput, 64-byte echo
round trip (p50/p99) and, in separate child processes (one hub, one agent), RSS per idle stream
and how many concurrent streams were opened and verified usable.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import gc
import json
import os
import platform
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from certs.files import cert_pem, write_pair
from certs.issue import create_ca, issue_agent, issue_server
from certs.tls import TLS1_3, client_context, server_context
from tunnel.backoff import Backoff
from tunnel.connection import ALPN, OpenRequest, SessionConfig
from tunnel.dialer import AgentDialer
from tunnel.errors import OpenErrorCode
from tunnel.listener import TunnelListener, start_tunnel_listener
from tunnel.registry import SessionRegistry
from tunnel.targets import TCPTarget

HOST = "127.0.0.1"
CLUSTER = "bench"
MiB = 1024 * 1024
CHUNK = 256 * 1024
STEP_TIMEOUT = 120.0  # no single measurement may take longer than this
GOALS = {
    "single_stream_ratio": ("one stream >= 60% of the plain TLS copy", 0.60, ">="),
    "rtt_p99_added_us": ("p99 added round trip <= 1 ms", 1000.0, "<="),
    "idle_stream_bytes": ("<= 4 KiB per idle stream", 4096.0, "<="),
    "max_streams": ("10,000 concurrent streams in one session", 10_000, ">="),
}


@dataclass
class Sizes:
    single_bytes: int
    aggregate_bytes: int
    repeats: int
    rtt_samples: int
    idle_streams: int


FULL = Sizes(512 * MiB, 512 * MiB, 3, 5000, 10_000)
QUICK = Sizes(128 * MiB, 128 * MiB, 3, 2000, 10_000)
SMOKE = Sizes(8 * MiB, 8 * MiB, 3, 200, 500)


# PKI ------------------------------------------------------------------------------------------

def make_pki(root: Path) -> Path:
    """tunnel-ca.crt, server/{tls.crt,tls.key}, agent/{tls.crt,tls.key,ca.crt} under ``root``."""
    ca = create_ca("bench tunnel CA", days=1)
    (root / "tunnel-ca.crt").write_bytes(cert_pem(ca.cert))
    for name, issued in (("server", issue_server(ca, "hub", ["localhost", HOST], days=1)),
                         ("agent", issue_agent(ca, CLUSTER, days=1))):
        (root / name).mkdir()
        write_pair(root / name, issued, ca.cert, force=False)
    return root


def hub_context(pki: Path, alpn: bool = True):
    return server_context(pki / "server/tls.crt", pki / "server/tls.key", pki / "tunnel-ca.crt",
                          min_version=TLS1_3, alpn_protocols=[ALPN] if alpn else None)


def agent_context(pki: Path, alpn: bool = True):
    d = pki / "agent"
    return client_context(d / "ca.crt", d / "tls.crt", d / "tls.key", min_version=TLS1_3,
                          alpn_protocols=[ALPN] if alpn else None)


# Protocols (each works on an asyncio transport and on a TunnelStream: same method names) -------

class Relay:
    """Raw relay from an upstream (TunnelStream or TLS transport) to a TCP destination.

    Reading from upstream is paused until the destination is connected; a TunnelStream is
    accepted only then (an unreachable target is refused with a typed code). Back-pressure
    both ways: a full destination pauses reading the upstream and vice versa.
    """

    def __init__(self, dest: tuple[str, int] | None = None) -> None:
        self.dest = dest
        self.up: Any = None
        self.down: asyncio.Transport | None = None
        self.up_eof = False
        self.task: asyncio.Task[None] | None = None

    # upstream side
    def connection_made(self, up: Any) -> None:
        self.up = up
        up.pause_reading()
        self.task = asyncio.get_running_loop().create_task(self._dial())

    async def _dial(self) -> None:
        dest = self.dest
        if dest is None:
            target = self.up.target
            if not isinstance(target, TCPTarget):
                self.up.refuse(OpenErrorCode.DENIED, "bench relays TCP targets only")
                return
            dest = (target.host, target.port)
        loop = asyncio.get_running_loop()
        try:
            down, _ = await loop.create_connection(lambda: _Down(self), *dest)
        except OSError as exc:
            if hasattr(self.up, "refuse"):
                self.up.refuse(OpenErrorCode.UNREACHABLE, str(exc))
            else:
                self.up.close()
            return
        if self.up.is_closing() and not hasattr(self.up, "accept"):
            down.close()
            return
        self.down = down
        if hasattr(self.up, "accept"):
            self.up.accept()
        if self.up_eof:
            down.write_eof()
        self.up.resume_reading()

    def data_received(self, data: bytes | memoryview) -> None:
        self.down.write(bytes(data))  # a stream's memoryview must not be kept

    def eof_received(self) -> None:  # falsy: a TLS upstream then closes itself
        self.up_eof = True
        if self.down is not None and self.down.can_write_eof():
            self.down.write_eof()

    def connection_lost(self, exc: BaseException | None) -> None:
        if self.down is not None:
            self.down.close()
        elif self.task is not None:
            self.task.cancel()

    def pause_writing(self) -> None:
        if self.down is not None:
            self.down.pause_reading()

    def resume_writing(self) -> None:
        if self.down is not None:
            self.down.resume_reading()


class _Down(asyncio.Protocol):
    def __init__(self, relay: Relay) -> None:
        self.relay = relay

    def data_received(self, data: bytes) -> None:
        self.relay.up.write(data)

    def eof_received(self) -> bool:
        up = self.relay.up
        if up.can_write_eof():
            up.write_eof()
        else:
            up.close()
        return True

    def connection_lost(self, exc: BaseException | None) -> None:
        if not self.relay.up.is_closing():
            self.relay.up.close()

    def pause_writing(self) -> None:
        self.relay.up.pause_reading()

    def resume_writing(self) -> None:
        self.relay.up.resume_reading()


class Source:
    """Pushes ``total`` bytes as fast as the transport/stream lets it (obeys pause_writing)."""

    def __init__(self, total: int) -> None:
        self.total = total
        self.sent = 0
        self.paused = False
        self.chunk = os.urandom(CHUNK)
        self.t: Any = None
        self.lost: asyncio.Future[BaseException | None] = asyncio.get_running_loop().create_future()

    def connection_made(self, t: Any) -> None:
        self.t = t

    def start(self) -> None:
        """Called once every connection is up, so handshakes are not timed."""
        self.pump()

    def pump(self) -> None:
        chunk, t = self.chunk, self.t
        while not self.paused and self.sent < self.total and not self.lost.done():
            n = min(CHUNK, self.total - self.sent)
            t.write(chunk if n == CHUNK else chunk[:n])
            self.sent += n

    def pause_writing(self) -> None:
        self.paused = True

    def resume_writing(self) -> None:
        self.paused = False
        asyncio.get_running_loop().call_soon(self.pump)

    def data_received(self, data: Any) -> None:
        pass

    def eof_received(self) -> None:
        pass

    def connection_lost(self, exc: BaseException | None) -> None:
        if not self.lost.done():
            self.lost.set_result(exc)


class Sink(asyncio.Protocol):
    """Counts bytes of all connections; resolves ``done`` when ``expected`` arrived."""

    def __init__(self, state: SinkState) -> None:
        self.state = state

    def data_received(self, data: bytes) -> None:
        st = self.state
        st.received += len(data)
        if st.received >= st.expected and not st.done.done():
            st.done.set_result(time.perf_counter())


@dataclass
class SinkState:
    expected: int
    done: asyncio.Future[float]
    received: int = 0


class Echo(asyncio.Protocol):
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.t = transport

    def data_received(self, data: bytes) -> None:
        self.t.write(data)


class Pinger:
    """Sends ``size`` bytes, waits for them to come back, records the round trip, repeats."""

    def __init__(self, size: int = 64) -> None:
        self.msg = b"p" * size
        self.got = 0
        self.t: Any = None
        self.sent_at = 0
        self.samples: list[int] = []
        self.want = 0
        self.done: asyncio.Future[None] | None = None

    def connection_made(self, t: Any) -> None:
        self.t = t

    async def run(self, n: int) -> list[int]:
        self.samples, self.want = [], n
        self.done = asyncio.get_running_loop().create_future()
        self._send()
        await asyncio.wait_for(self.done, STEP_TIMEOUT)
        return self.samples

    def _send(self) -> None:
        self.got = 0
        self.sent_at = time.perf_counter_ns()
        self.t.write(self.msg)

    def data_received(self, data: Any) -> None:
        self.got += len(data)
        if self.got < len(self.msg):
            return
        self.samples.append(time.perf_counter_ns() - self.sent_at)
        if len(self.samples) >= self.want:
            self.done.set_result(None)
        else:
            self._send()

    def eof_received(self) -> None:
        pass

    def connection_lost(self, exc: BaseException | None) -> None:
        if self.done is not None and not self.done.done():
            self.done.set_exception(RuntimeError(f"connection lost during RTT: {exc}"))

    def pause_writing(self) -> None:
        pass

    def resume_writing(self) -> None:
        pass


def relay_on_open(request: OpenRequest) -> Relay:
    return Relay()


# The two configurations ------------------------------------------------------------------------

class Bench:
    """A hub (listener + registry), a connected AgentDialer, and the plain TLS relay server."""

    def __init__(self, pki: Path) -> None:
        self.pki = pki
        self.client_ctx = agent_context(pki, alpn=False)

    async def __aenter__(self) -> Bench:
        loop = asyncio.get_running_loop()
        self.registry = SessionRegistry()
        self.listener: TunnelListener = await start_tunnel_listener(
            HOST, 0, hub_context(self.pki), self.registry, SessionConfig())
        self.dialer = AgentDialer(HOST, self.listener.port, lambda: agent_context(self.pki),
                                  relay_on_open, SessionConfig(), server_hostname="localhost",
                                  backoff=Backoff(base=0.05, cap=0.5))
        self.dialer_task = loop.create_task(self.dialer.run())
        self.plain_dest: tuple[str, int] = (HOST, 1)
        self.plain = await loop.create_server(lambda: Relay(self.plain_dest), HOST, 0,
                                              ssl=hub_context(self.pki, alpn=False))
        self.plain_port = self.plain.sockets[0].getsockname()[1]
        deadline = time.monotonic() + 10
        while self.registry.pick(CLUSTER) is None:
            if time.monotonic() > deadline:
                raise RuntimeError("the agent did not register with the hub within 10 s")
            await asyncio.sleep(0.02)
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.dialer.drain(1.0)
        with contextlib.suppress(Exception):
            await asyncio.wait_for(self.dialer_task, 5)
        self.listener.close()
        await self.listener.wait_closed()
        self.plain.close()

    async def open(self, kind: str, dest: tuple[str, int], protocol: Any) -> Any:
        """Connect ``protocol`` to ``dest`` through the tunnel or through the plain TLS relay."""
        if kind == "tunnel":
            session = self.registry.pick(CLUSTER)
            return session.open_stream(TCPTarget(*dest), b"", protocol)
        self.plain_dest = dest
        loop = asyncio.get_running_loop()
        transport, _ = await loop.create_connection(lambda: protocol, HOST, self.plain_port,
                                                    ssl=self.client_ctx,
                                                    server_hostname="localhost")
        return transport

    async def copy(self, kind: str, total: int, streams: int) -> float:
        """Push ``total`` bytes over ``streams`` connections to one TCP sink; MB/s (10^6)."""
        loop = asyncio.get_running_loop()
        state = SinkState(total, loop.create_future())
        sink = await loop.create_server(lambda: Sink(state), HOST, 0)
        dest = (HOST, sink.sockets[0].getsockname()[1])
        handles, sources = [], []
        try:
            per = total // streams
            for i in range(streams):
                size = per if i < streams - 1 else total - per * (streams - 1)
                sources.append(Source(size))
                handles.append(await self.open(kind, dest, sources[-1]))
            start = time.perf_counter()
            for source in sources:
                source.start()
            end = await asyncio.wait_for(state.done, STEP_TIMEOUT)
            return total / (end - start) / 1e6
        finally:
            for h in handles:
                h.close()
            sink.close()
            await asyncio.sleep(0.05)

    async def rtt(self, kind: str, dest: tuple[str, int], n: int) -> list[int]:
        pinger = Pinger()
        handle = await self.open(kind, dest, pinger)
        try:
            await pinger.run(min(50, n))  # warm-up: dial, accept, first-use allocations
            return await pinger.run(n)
        finally:
            handle.close()


def pct(values: list[int], q: float) -> float:
    ordered = sorted(values)
    return float(ordered[min(len(ordered) - 1, int(q * len(ordered)))])


async def measure_data_path(pki: Path, sizes: Sizes, log: Any) -> dict[str, Any]:
    kinds = ("tunnel", "plain")
    raw: dict[str, Any] = {"single_mb_s": {k: [] for k in kinds},
                           "aggregate64_mb_s": {k: [] for k in kinds}}
    async with Bench(pki) as bench:
        # Warm-up (not recorded): TLS sessions, window auto-tuning code paths, allocator.
        for kind in kinds:
            await bench.copy(kind, min(sizes.single_bytes, 16 * MiB), 1)
        for rep in range(sizes.repeats):
            for kind in kinds:
                v = await bench.copy(kind, sizes.single_bytes, 1)
                raw["single_mb_s"][kind].append(v)
                log(f"  single {kind:6} rep {rep + 1}: {v:8.1f} MB/s")
        for rep in range(sizes.repeats):
            for kind in kinds:
                v = await bench.copy(kind, sizes.aggregate_bytes, 64)
                raw["aggregate64_mb_s"][kind].append(v)
                log(f"  64x    {kind:6} rep {rep + 1}: {v:8.1f} MB/s")
        loop = asyncio.get_running_loop()
        echo = await loop.create_server(Echo, HOST, 0)
        dest = (HOST, echo.sockets[0].getsockname()[1])
        samples: dict[str, list[int]] = {k: [] for k in kinds}
        rounds = 5
        for _ in range(rounds):
            for kind in kinds:
                samples[kind] += await bench.rtt(kind, dest, max(1, sizes.rtt_samples // rounds))
        echo.close()
        log(f"  rtt: {len(samples['tunnel'])} samples per configuration")
    rtt = {k: {"p50_us": pct(v, 0.50) / 1e3, "p99_us": pct(v, 0.99) / 1e3,
               "mean_us": statistics.fmean(v) / 1e3, "samples": len(v)}
           for k, v in samples.items()}
    raw["rtt"] = rtt
    return raw


# Idle streams in child processes ---------------------------------------------------------------

def rss_bytes() -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    return 0


class IdleEcho:
    """Agent side of an idle stream: accept at once, echo the probe byte, then sit there."""

    __slots__ = ("stream",)

    def connection_made(self, stream: Any) -> None:
        self.stream = stream
        stream.accept()

    def data_received(self, data: Any) -> None:
        self.stream.write(bytes(data))

    def eof_received(self) -> None:
        self.stream.write_eof()

    def connection_lost(self, exc: Any) -> None:
        pass

    def pause_writing(self) -> None:
        pass

    def resume_writing(self) -> None:
        pass


class IdleProbe:
    """Hub side of an idle stream: counts the echoed probe byte, notes a refusal or loss."""

    __slots__ = ("counter",)

    def __init__(self, counter: list[int]) -> None:
        self.counter = counter

    def connection_made(self, stream: Any) -> None:
        pass

    def data_received(self, data: Any) -> None:
        self.counter[0] += 1

    def eof_received(self) -> None:
        pass

    def connection_lost(self, exc: Any) -> None:
        self.counter[1] += 1

    def pause_writing(self) -> None:
        pass

    def resume_writing(self) -> None:
        pass


async def _read_commands(handle) -> None:
    """Line commands on stdin, one answer line (JSON) each on stdout; ``quit`` ends."""
    loop = asyncio.get_running_loop()
    while True:
        line = await loop.run_in_executor(None, sys.stdin.readline)
        cmd = line.split()
        if not cmd or cmd[0] == "quit":
            return
        answer = await handle(cmd)
        print(json.dumps(answer), flush=True)


async def hub_child(pki: Path) -> None:
    registry = SessionRegistry()
    listener = await start_tunnel_listener(HOST, 0, hub_context(pki), registry, SessionConfig())
    print(json.dumps({"port": listener.port}), flush=True)
    kept: list[Any] = []

    async def handle(cmd: list[str]) -> dict[str, Any]:
        if cmd[0] == "wait":
            deadline = time.monotonic() + 10
            while registry.pick(CLUSTER) is None and time.monotonic() < deadline:
                await asyncio.sleep(0.02)
            return {"ok": registry.pick(CLUSTER) is not None}
        if cmd[0] == "rss":
            gc.collect()
            await asyncio.sleep(0.2)
            return {"rss": rss_bytes()}
        if cmd[0] == "open":  # open N, verify each with a 1-byte echo; keep them open
            n, batch = int(cmd[1]), 250
            session = registry.pick(CLUSTER)
            counter = [0, 0]
            target = TCPTarget("idle", 9)
            deadline = time.monotonic() + STEP_TIMEOUT
            opened = 0
            while opened < n and time.monotonic() < deadline:
                k = min(batch, n - opened)
                for _ in range(k):
                    kept.append(session.open_stream(target, b"", IdleProbe(counter),
                                                    initial_data=b"x"))
                opened += k
                while counter[0] + counter[1] < opened and time.monotonic() < deadline:
                    await asyncio.sleep(0.005)
            return {"opened": opened, "echoed": counter[0], "lost": counter[1],
                    "active": session.active_streams}
        if cmd[0] == "close":
            for stream in kept:
                stream.reset()
            kept.clear()
            await asyncio.sleep(0.2)
            return {"active": sum(s.active_streams for s in registry.all_sessions())}
        return {"error": f"unknown command {cmd}"}

    try:
        await _read_commands(handle)
    finally:
        listener.close()
        await listener.wait_closed()


async def agent_child(pki: Path, port: int) -> None:
    dialer = AgentDialer(HOST, port, lambda: agent_context(pki), lambda req: IdleEcho(),
                         SessionConfig(), server_hostname="localhost",
                         backoff=Backoff(base=0.05, cap=0.5))
    task = asyncio.get_running_loop().create_task(dialer.run())

    async def handle(cmd: list[str]) -> dict[str, Any]:
        if cmd[0] == "rss":
            gc.collect()
            await asyncio.sleep(0.2)
            session = dialer.session
            return {"rss": rss_bytes(), "active": session.active_streams if session else 0}
        return {"error": f"unknown command {cmd}"}

    try:
        await _read_commands(handle)
    finally:
        await dialer.drain(1.0)
        with contextlib.suppress(Exception):
            await asyncio.wait_for(task, 5)


class Child:
    """One child process we started: line commands in, JSON lines out, each with a timeout."""

    def __init__(self, proc: asyncio.subprocess.Process) -> None:
        self.proc = proc

    @classmethod
    async def start(cls, *args: str) -> Child:
        proc = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "bench.tunnel", *args, stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE, start_new_session=True)
        return cls(proc)

    async def read(self, timeout: float = STEP_TIMEOUT) -> dict[str, Any]:
        line = await asyncio.wait_for(self.proc.stdout.readline(), timeout)
        if not line:
            raise RuntimeError(f"child {self.proc.pid} exited ({await self.proc.wait()})")
        return json.loads(line)

    async def ask(self, command: str, timeout: float = STEP_TIMEOUT) -> dict[str, Any]:
        self.proc.stdin.write(command.encode() + b"\n")
        await self.proc.stdin.drain()
        return await self.read(timeout)

    async def stop(self) -> None:
        if self.proc.returncode is None:
            with contextlib.suppress(Exception):
                self.proc.stdin.write(b"quit\n")
                await self.proc.stdin.drain()
            try:
                await asyncio.wait_for(self.proc.wait(), 10)
            except TimeoutError:
                self.proc.kill()
                await self.proc.wait()


async def measure_idle_streams(pki: Path, n: int, log: Any) -> dict[str, Any]:
    children: list[Child] = []
    try:
        hub = await Child.start("--hub-child", str(pki))
        children.append(hub)
        port = (await hub.read(30))["port"]
        agent = await Child.start("--agent-child", str(pki), str(port))
        children.append(agent)
        if not (await hub.ask("wait"))["ok"]:
            raise RuntimeError("the agent child did not register")
        # Warm-up: a first batch opened and closed, so one-off allocations are not counted.
        await hub.ask("open 200")
        await hub.ask("close")
        hub0, agent0 = (await hub.ask("rss"))["rss"], (await agent.ask("rss"))["rss"]
        opened = await hub.ask(f"open {n}")
        hub1, agent_after = (await hub.ask("rss"))["rss"], await agent.ask("rss")
        agent1 = agent_after["rss"]
        usable = min(opened["echoed"], opened["active"], agent_after["active"])
        log(f"  idle: opened {opened['opened']}, echoed {opened['echoed']}, "
            f"hub active {opened['active']}, agent active {agent_after['active']}")
        per = max(1, usable)
        return {"requested": n, "opened": opened["opened"], "echoed": opened["echoed"],
                "lost": opened["lost"], "hub_active": opened["active"],
                "agent_active": agent_after["active"], "max_streams": usable,
                "hub_rss_before": hub0, "hub_rss_after": hub1,
                "agent_rss_before": agent0, "agent_rss_after": agent1,
                "hub_bytes_per_stream": (hub1 - hub0) / per,
                "agent_bytes_per_stream": (agent1 - agent0) / per}
    finally:
        # Hub first: its close() ends every stream locally. Stopping the agent first would
        # make its drain RESET all N streams at once, which the hub's RESET-flood limit
        # (2000/s) answers with a protocol error.
        for child in children:
            await child.stop()


# Report ----------------------------------------------------------------------------------------

def machine_info() -> dict[str, Any]:
    model = platform.processor() or "unknown"
    with contextlib.suppress(OSError), open("/proc/cpuinfo") as f:
        for line in f:
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    try:
        import uvloop  # noqa: F401
        has_uvloop = True
    except ImportError:
        has_uvloop = False
    import ssl
    return {"nproc": os.cpu_count(), "cpu_model": model, "python": sys.version.split()[0],
            "implementation": platform.python_implementation(), "uvloop": has_uvloop,
            "openssl": ssl.OPENSSL_VERSION, "platform": platform.platform()}


def summarize(raw: dict[str, Any], idle: dict[str, Any]) -> dict[str, Any]:
    single = {k: statistics.median(v) for k, v in raw["single_mb_s"].items()}
    agg = {k: statistics.median(v) for k, v in raw["aggregate64_mb_s"].items()}
    rtt = raw["rtt"]
    return {
        "single_stream_ratio": single["tunnel"] / single["plain"],
        "aggregate_mb_s": agg["tunnel"],
        "rtt_p50_us": rtt["tunnel"]["p50_us"],
        "rtt_p99_us": rtt["tunnel"]["p99_us"],
        "rtt_p50_added_us": rtt["tunnel"]["p50_us"] - rtt["plain"]["p50_us"],
        "rtt_p99_added_us": rtt["tunnel"]["p99_us"] - rtt["plain"]["p99_us"],
        "idle_stream_bytes": max(idle["hub_bytes_per_stream"], idle["agent_bytes_per_stream"]),
        "max_streams": idle["max_streams"],
        "single_mb_s_tunnel": single["tunnel"],
        "single_mb_s_plain": single["plain"],
        "aggregate_mb_s_plain": agg["plain"],
    }


def goals(summary: dict[str, Any]) -> dict[str, dict[str, Any]]:
    out = {}
    for key, (text, limit, op) in GOALS.items():
        value = summary[key]
        ok = value >= limit if op == ">=" else value <= limit
        out[key] = {"goal": text, "value": value, "limit": limit, "pass": ok}
    return out


def table(summary: dict[str, Any], raw: dict[str, Any], idle: dict[str, Any],
          verdicts: dict[str, Any]) -> str:
    rtt = raw["rtt"]
    rows = [
        ("single stream MB/s (median)", f"{summary['single_mb_s_tunnel']:.1f}",
         f"{summary['single_mb_s_plain']:.1f}", f"ratio {summary['single_stream_ratio']:.2f}"),
        ("64 streams aggregate MB/s", f"{summary['aggregate_mb_s']:.1f}",
         f"{summary['aggregate_mb_s_plain']:.1f}",
         f"ratio {summary['aggregate_mb_s'] / summary['aggregate_mb_s_plain']:.2f}"),
        ("64 B echo RTT p50 us", f"{rtt['tunnel']['p50_us']:.0f}", f"{rtt['plain']['p50_us']:.0f}",
         f"added {summary['rtt_p50_added_us']:.0f}"),
        ("64 B echo RTT p99 us", f"{rtt['tunnel']['p99_us']:.0f}", f"{rtt['plain']['p99_us']:.0f}",
         f"added {summary['rtt_p99_added_us']:.0f}"),
        ("idle stream bytes (hub/agent)", f"{idle['hub_bytes_per_stream']:.0f}",
         f"{idle['agent_bytes_per_stream']:.0f}", f"max {summary['idle_stream_bytes']:.0f}"),
        ("concurrent streams verified", f"{summary['max_streams']}", "",
         f"of {idle['requested']}"),
    ]
    w = max(len(r[0]) for r in rows)
    lines = [f"{'':{w}}  {'tunnel':>10}  {'plain TLS':>10}  note",
             *(f"{a:{w}}  {b:>10}  {c:>10}  {d}" for a, b, c, d in rows), "", "goals:"]
    for v in verdicts.values():
        value = v["value"]
        shown = f"{value:.2f}" if isinstance(value, float) else str(value)
        lines.append(f"  {'PASS' if v['pass'] else 'MISS'}  {v['goal']} (measured {shown})")
    return "\n".join(lines)


async def run_all(sizes: Sizes, log: Any) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="bench-tunnel-") as tmp:
        pki = make_pki(Path(tmp))
        log("data path (tunnel and plain TLS alternate):")
        raw = await measure_data_path(pki, sizes, log)
        log(f"idle streams ({sizes.idle_streams}) in child processes:")
        idle = await measure_idle_streams(pki, sizes.idle_streams, log)
    summary = summarize(raw, idle)
    return {"summary": summary, "raw": raw, "idle": idle}


def run_loop(coro_factory: Any) -> Any:
    try:
        import uvloop
        factory = uvloop.new_event_loop
    except ImportError:
        factory = None
    with asyncio.Runner(loop_factory=factory) as runner:
        return runner.run(coro_factory())


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--json", metavar="FILE", help="write the results as JSON here")
    mode = parser.add_mutually_exclusive_group()
    mode.add_argument("--quick", action="store_true", help="128 MiB copies, 2000 RTT samples")
    mode.add_argument("--smoke", action="store_true",
                      help="tiny run for tests: 8 MiB, 200 RTT samples, 500 idle streams")
    parser.add_argument("--idle-streams", type=int, help="idle streams to open (override)")
    parser.add_argument("--plot", metavar="DIR",
                        help="also write PNG charts of the results into DIR (needs matplotlib: "
                        "pip install -e '.[bench]')")
    parser.add_argument("--hub-child", metavar="PKI", help=argparse.SUPPRESS)
    parser.add_argument("--agent-child", nargs=2, metavar=("PKI", "PORT"), help=argparse.SUPPRESS)


def run(args: argparse.Namespace) -> int:
    if args.hub_child:
        run_loop(lambda: hub_child(Path(args.hub_child)))
        return 0
    if args.agent_child:
        run_loop(lambda: agent_child(Path(args.agent_child[0]), int(args.agent_child[1])))
        return 0
    if args.plot:
        from bench.plots import _pyplot

        _pyplot()  # fail now, not after the run, when matplotlib is missing
    sizes = SMOKE if args.smoke else QUICK if args.quick else FULL
    if args.idle_streams:
        sizes.idle_streams = args.idle_streams

    def log(msg: str) -> None:
        print(msg, file=sys.stderr, flush=True)

    started = time.monotonic()
    result = run_loop(lambda: run_all(sizes, log))
    verdicts = goals(result["summary"])
    out = {**result["summary"], "goals": verdicts, "raw": result["raw"], "idle": result["idle"],
           "sizes": sizes.__dict__, "machine": machine_info(),
           "mode": "smoke" if args.smoke else "quick" if args.quick else "full",
           "elapsed_s": time.monotonic() - started}
    print(table(result["summary"], result["raw"], result["idle"], verdicts))
    m = out["machine"]
    print(f"\nmachine: {m['nproc']} cpu, {m['cpu_model']}, Python {m['python']}, "
          f"uvloop {'yes' if m['uvloop'] else 'no'}, {m['openssl']}")
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=2) + "\n")
    if args.plot:
        from bench.plots import tunnel_charts

        for path in tunnel_charts(out, args.plot):
            print(f"chart: {path}")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench tunnel",
                                     description=__doc__.split("\n")[0])
    add_arguments(parser)
    return run(parser.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
