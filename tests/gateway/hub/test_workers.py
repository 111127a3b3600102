"""``hubproxy gateway --workers 2`` with a real agent process: every request crosses, whichever
worker the kernel hands its connection to, because the agent holds a session to each worker.
Also the fan-out alone: two tunnel listeners sharing one port, one agent fan-out."""

from __future__ import annotations

import asyncio
import contextlib
import json
import signal
import socket
import subprocess
import sys
import urllib.request
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from certs import layout
from gateway.fixtures import agent_args, agent_kubeconfig, write_private
from tests.gateway.hub.hubsim import DEMO_USER as USER
from tests.gateway.hub.hubsim import hub_and_cluster
from tests.support import ProcessGroup, free_port

pytestmark = pytest.mark.timeout(120)


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("pki")
    layout.init(root, layout.InitOptions(clusters=["c1"]))
    return root


async def whoami(front: int, ca: Path, token: str) -> tuple[int, dict]:
    """One request on a fresh connection (so the kernel picks a worker each time)."""
    curl = await asyncio.create_subprocess_exec(
        "curl", "-sS", "--cacert", str(ca), "-X", "POST", "-w", "\n%{http_code}",
        "-H", f"Authorization: Bearer {token}", "-H", "Content-Type: application/json",
        "-d", '{"apiVersion":"authentication.k8s.io/v1","kind":"SelfSubjectReview"}',
        f"https://127.0.0.1:{front}/c1/apis/authentication.k8s.io/v1/selfsubjectreviews",
        stdout=asyncio.subprocess.PIPE)
    out, _ = await asyncio.wait_for(curl.communicate(), 20)
    body, _, code = out.decode().rpartition("\n")
    return int(code), json.loads(body) if body.startswith("{") else {}


def scrape(port: int) -> str:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as response:
        return response.read().decode()


@pytest.mark.slow
async def test_two_workers_serve_every_request_through_one_agent(pki: Path,
                                                                   tmp_path: Path) -> None:
    async with hub_and_cluster(tmp_path) as sims:
        token, managed = sims.user_token, sims.managed
        agent_token_file = write_private(tmp_path / "agent-token", sims.agent_token)
        agent_kc = write_private(tmp_path / "agent-kc", yaml.safe_dump(agent_kubeconfig(
            managed.url, managed.ca_file, str(agent_token_file))))
        front, tunnel, health = free_port(), free_port(), free_port()
        group = ProcessGroup()
        try:
            gateway = group.hubproxy(
                "gateway", "--tls-dir", str(pki / "gateway"),
                "--tunnel-tls-dir", str(pki / "tunnel-server"),
                "--agent-ca", str(pki / "tunnel-ca" / "ca.crt"),
                "--listen", f"127.0.0.1:{front}", "--tunnel-listen", f"127.0.0.1:{tunnel}",
                "--health-listen", f"127.0.0.1:{health}",
                "--hub-kubeconfig", str(sims.hub_kubeconfig), "--workers", "2",
                "--shutdown-timeout", "3")
            await asyncio.to_thread(gateway.wait_for_line, "hubproxy gateway ready", 30)
            agent = group.hubproxy(*agent_args(pki, "c1", hub=f"127.0.0.1:{tunnel}",
                                               kubeconfig=agent_kc, health_listen="off"),
                                   "--allow-loopback-targets")
            await asyncio.to_thread(agent.wait_for_line, "dialling session 2", 30)
            ca = pki / "front-ca" / "ca.crt"
            try:
                async with asyncio.timeout(30):  # until each worker has registered a session
                    while sum("cluster c1 connected" in line for line in gateway.lines) < 2:
                        await asyncio.sleep(0.05)
            except TimeoutError:
                raise AssertionError(f"--- gateway\n{gateway.output[-3000:]}\n"
                                     f"--- agent\n{agent.output[-3000:]}") from None
            results = await asyncio.gather(*(whoami(front, ca, token) for _ in range(40)))
            assert [code for code, _ in results] == [201] * 40, results
            assert {r["status"]["userInfo"]["username"] for _, r in results} == {USER}
            # Every request leaves one audit line, whichever worker served it. The lines reach us
            # through a pipe and a reader thread, so they may trail the responses a little.
            def audit() -> list[dict]:
                return [json.loads(line) for line in gateway.lines if line.startswith('{"event"')]
            try:
                async with asyncio.timeout(10):
                    while len(audit()) < 40:
                        await asyncio.sleep(0.05)
            except TimeoutError:
                raise AssertionError(f"{len(audit())} audit lines of 40") from None
            assert {entry["cluster"] for entry in audit()} == {"c1"}
            # Worker 0 serves /metrics for the whole gateway: the other worker's requests are in
            # it too (they arrive with its next snapshot, within about a second).
            counted = 'hubproxy_requests_total{cluster="c1",code="2xx"} 40'
            metrics = ""
            try:
                async with asyncio.timeout(10):
                    while counted not in metrics:
                        metrics = await asyncio.to_thread(scrape, health)
                        await asyncio.sleep(0.1)
            except TimeoutError:
                raise AssertionError(metrics) from None
            assert "hubproxy_connected_clusters 1" in metrics
            assert "hubproxy_connected_agents 2" in metrics  # one session to each worker
            # So are the other worker's latency histograms and its tunnel session.
            assert 'hubproxy_request_duration_seconds_count{class="short"} 40' in metrics
            assert 'hubproxy_requests_by_code_total{code="201"} 40' in metrics
            assert 'hubproxy_tunnel_sessions{cluster="c1"} 2' in metrics
            # /clusters: one agent process, one session to each worker.
            with urllib.request.urlopen(f"http://127.0.0.1:{health}/clusters",
                                        timeout=5) as response:
                [c1] = json.loads(response.read())["clusters"]
            assert (c1["sessions"], c1["instances"]) == (2, 1), c1
            assert sorted(s["hub_worker"] for s in c1["session_details"]) == [0, 1]
            gateway.signal(signal.SIGTERM)
            rc = await asyncio.to_thread(gateway.popen.wait, 20)
            assert rc == 0, gateway.output[-3000:]
        finally:
            group.stop_all()


async def _two_listeners(pki: Path, port: int, announced: int,
                         listed: bool = False) -> tuple[list, list]:
    from certs.tls import TLS1_3, server_context
    from tunnel.connection import ALPN, SessionConfig
    from tunnel.listener import start_tunnel_listener
    from tunnel.registry import SessionRegistry

    server = pki / "tunnel-server"
    registries, listeners = [], []
    for instance in (101, 202):
        ctx = server_context(server / "tls.crt", server / "tls.key",
                             pki / "tunnel-ca" / "ca.crt", min_version=TLS1_3,
                             alpn_protocols=[ALPN])
        registry = SessionRegistry()
        listeners.append(await start_tunnel_listener(
            "127.0.0.1", port, ctx, registry,
            SessionConfig(hub_instance=instance, hub_instances=announced,
                          hub_peers=(101, 202) if listed else ()), reuse_port=True))
        registries.append(registry)
    return registries, listeners


def _fanout(pki: Path, port: int) -> Any:
    from certs.tls import TLS1_3, client_context
    from tunnel.connection import ALPN
    from tunnel.dialer import AgentDialer, HubFanout

    agent_dir = pki / "agents" / "c1"
    client = client_context(agent_dir / "ca.crt", agent_dir / "tls.crt", agent_dir / "tls.key",
                            min_version=TLS1_3, alpn_protocols=[ALPN])
    return HubFanout(lambda f: AgentDialer("127.0.0.1", port, lambda: client,
                                           lambda req: None, server_hostname="localhost",
                                           fanout=f))


@contextlib.asynccontextmanager
async def fanout_to_two_hubs(pki: Path, announced: int,
                             listed: bool = False) -> AsyncIterator[tuple[list, Any]]:
    """Two hub instances on one port (SO_REUSEPORT) announcing ``announced``, or, ``listed``,
    naming each other as ``--workers`` does; an agent fan-out dialling them; yields once both
    hubs hold a session for c1."""
    if not hasattr(socket, "SO_REUSEPORT"):
        pytest.skip("needs SO_REUSEPORT")
    port = free_port()
    registries, listeners = await _two_listeners(pki, port, announced, listed)
    fanout = _fanout(pki, port)
    task = asyncio.ensure_future(fanout.run())
    try:
        async with asyncio.timeout(30):
            while not (all(r.pick("c1") is not None for r in registries)
                       and len(fanout.sessions) == 2):
                await asyncio.sleep(0.05)
        yield registries, fanout
    finally:
        await fanout.drain(2)
        task.cancel()
        for listener in listeners:
            listener.close()


async def test_fanout_holds_one_session_per_hub_instance(pki: Path) -> None:
    async with fanout_to_two_hubs(pki, announced=2, listed=True) as (registries, fanout):
        assert len(fanout.dialers) == 2 and len(fanout.sessions) == 2
        assert sorted(s.hub_instance for s in fanout.sessions) == [101, 202]
        assert all(len(list(r.sessions("c1"))) == 1 for r in registries)


async def test_a_hub_announcing_more_instances_than_it_has_costs_few_redials(
    pki: Path,
) -> None:
    async with fanout_to_two_hubs(pki, announced=3) as (registries, fanout):
        assert len(fanout.dialers) == 3
        [third] = [d for d in fanout.dialers if d.session is None]
        before = third.connects
        await asyncio.sleep(4)
        # Redials back off (doubling from 50-300 ms): a fixed 50-300 ms would be ~20 in 4 s.
        assert third.connects - before <= 8
        assert all(len(list(r.sessions("c1"))) == 1 for r in registries)


SUPERVISED = """
import os, signal, sys, time
from gateway.hub import workers
from gateway.hub.config import GatewayConfig

def serve_one(config, link):
    assert link is not None  # each worker gets the metrics link
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM})  # as serve() does: handle it
    # One write(2) per line: two forked workers share the pipe, and print() may write a line
    # in pieces that interleave with the other worker's.
    siblings = ",".join(map(str, config.worker_instances))
    os.write(1, f"worker {config.worker_index} instance {config.hub_instance} of {siblings}\\n"
             .encode())
    if sys.argv[1] == "crash" and config.worker_index == 1:
        return 3
    signal.sigwait({signal.SIGTERM})
    return 0

if sys.argv[1] == "signalled-at-fork":  # SIGTERM lands on worker 0 before it resets handlers
    real_fork, forks = os.fork, []

    def fork():
        pid = real_fork()
        forks.append(pid)
        if pid == 0 and len(forks) == 1:
            os.kill(os.getpid(), signal.SIGTERM)
        return pid

    os.fork = fork

print("rc", workers.run(GatewayConfig(workers=2), serve_one), flush=True)
"""


def supervised(mode: str) -> subprocess.Popen[str]:
    return subprocess.Popen([sys.executable, "-c", SUPERVISED, mode], text=True,
                            stdout=subprocess.PIPE, start_new_session=True,
                            cwd=Path(__file__).resolve().parents[3])


def test_sigterm_reaches_every_worker_and_the_parent_exits_0() -> None:
    proc = supervised("normal")
    assert proc.stdout is not None
    seen = [proc.stdout.readline(), proc.stdout.readline()]
    assert all(len(line.split()) > 3 for line in seen), (seen, proc.poll())
    assert sorted(line.split()[1] for line in seen) == ["0", "1"]
    assert len({line.split()[3] for line in seen}) == 2  # distinct hub instance ids
    # Each worker knows the whole set (announced to agents as the live instances).
    [siblings] = {line.split()[5] for line in seen}
    assert sorted(siblings.split(",")) == sorted(line.split()[3] for line in seen)
    proc.send_signal(signal.SIGTERM)  # the parent only: it forwards
    out, _ = proc.communicate(timeout=20)
    assert "rc 0" in out and proc.returncode == 0


def test_a_worker_that_dies_stops_the_others_and_the_parent_exits_1() -> None:
    proc = supervised("crash")
    out, _ = proc.communicate(timeout=20)
    assert "rc 1" in out and proc.returncode == 0  # the script prints run()'s code


def test_a_sigterm_between_fork_and_the_workers_own_handlers_still_stops_it() -> None:
    proc = supervised("signalled-at-fork")
    out, _ = proc.communicate(timeout=20)
    # Worker 0 dies of it before serving; the parent then stops worker 1 and reports 1.
    assert "worker 0" not in out
    assert "rc 1" in out and proc.returncode == 0


async def _listener(pki: Path, port: int, instance: int, peers: tuple[int, ...]) -> Any:
    from certs.tls import TLS1_3, server_context
    from tunnel.connection import ALPN, SessionConfig
    from tunnel.listener import start_tunnel_listener
    from tunnel.registry import SessionRegistry

    server = pki / "tunnel-server"
    ctx = server_context(server / "tls.crt", server / "tls.key", pki / "tunnel-ca" / "ca.crt",
                         min_version=TLS1_3, alpn_protocols=[ALPN])
    # hub_instances 1: only the announced set (HUB_PEER) can tell the agent there are more.
    return await start_tunnel_listener(
        "127.0.0.1", port, ctx, SessionRegistry(),
        SessionConfig(hub_instance=instance, hub_instances=1, hub_peers=peers), reuse_port=True)


async def test_fanout_follows_the_announced_live_instances(pki: Path) -> None:
    if not hasattr(socket, "SO_REUSEPORT"):
        pytest.skip("needs SO_REUSEPORT")
    port = free_port()
    first = await _listener(pki, port, 101, (101, 202))
    second = await _listener(pki, port, 202, (101, 202))
    fanout = _fanout(pki, port)
    task = asyncio.ensure_future(fanout.run())
    third = None
    try:
        async with asyncio.timeout(30):
            while sorted(s.hub_instance for s in fanout.sessions) != [101, 202]:
                await asyncio.sleep(0.05)
        # 202 leaves (its sessions end) and 101 announces itself alone: one dialer is let go.
        second.close()
        first.announce_hub_peers((101,))
        async with asyncio.timeout(30):
            while len(fanout.dialers) != 1 or [s.hub_instance for s in fanout.sessions] != [101]:
                await asyncio.sleep(0.05)
        # 303 arrives and 101 announces both, on its established session: the agent dials it.
        third = await _listener(pki, port, 303, (101, 303))
        first.announce_hub_peers((101, 303))
        async with asyncio.timeout(30):
            while sorted(s.hub_instance for s in fanout.sessions) != [101, 303]:
                await asyncio.sleep(0.05)
        assert len(fanout.dialers) == 2
    finally:
        await fanout.drain(2)
        task.cancel()
        for listener in (first, second, third):
            if listener is not None:
                listener.close()
