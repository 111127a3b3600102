"""The agent's memory per idle watch against the real kube-apiserver: HTTP/2 vs HTTP/1.1.

Two agents (``--apiserver-protocol h2`` and ``h1``), each behind its own gateway, hold the same
number of idle watches opened through the gateway; the agent's RSS is read from /proc before
and after. Over HTTP/1.1 each watch holds a TLS connection to the apiserver; over HTTP/2 it is a
stream of a shared connection. By default 100 watches (a few seconds: enough to tell the two
apart); the issue's figure, checked against its goal of 8 KiB, with
``HUBPROXY_AGENT_WATCHES=2000``::

    HUBPROXY_AGENT_WATCHES=2000 python3 -m pytest tests/realkube/test_agent_h2_memory.py -s \\
        -p no:cacheprovider
"""

from __future__ import annotations

import asyncio
import os
import ssl
from pathlib import Path

from tests.realkube.conftest import Fleet
from tests.realkube.hubproxy import CLUSTER, Gateway, start_gateway, wait_connected
from tests.support import LOOPBACK, ProcessGroup, free_port

WATCHES = int(os.environ.get("HUBPROXY_AGENT_WATCHES", "100"))
H2_GOAL = 8 * 1024  # bytes of agent RSS per idle watch (issue 15)


def rss(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise AssertionError("no VmRSS")


async def hold_watches(gateway: Gateway, token: str, count: int) -> list[asyncio.StreamWriter]:
    """``count`` idle watches through the gateway, each on its own client connection."""
    context = ssl.create_default_context(cafile=str(gateway.ca_file))
    request = (f"GET /{CLUSTER}/api/v1/namespaces/team/configmaps?watch=1&"
               f"labelSelector=nothing%3Dhere HTTP/1.1\r\nHost: gw\r\n"
               f"Authorization: Bearer {token}\r\n\r\n").encode()

    async def one() -> asyncio.StreamWriter:
        reader, writer = await asyncio.open_connection(LOOPBACK, gateway.front_port,
                                                       ssl=context, server_hostname=LOOPBACK)
        writer.write(request)
        head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 60)
        assert head.startswith(b"HTTP/1.1 200"), head[:300]
        return writer

    writers: list[asyncio.StreamWriter] = []
    for start in range(0, count, 100):  # bounded batches: the machine has two cores
        writers += await asyncio.gather(*(one() for _ in range(min(100, count - start))))
    return writers


def measure(fleet: Fleet, protocol: str) -> float:
    """Agent RSS bytes per idle watch with ``--apiserver-protocol protocol``."""
    group = ProcessGroup()
    try:
        gateway = start_gateway(
            group, fleet.pki, fleet.gateway_kubeconfig, fleet.agent_kubeconfig,
            "--max-streams-per-identity", str(WATCHES + 100),
            agent_args=("--health-listen", f"{LOOPBACK}:{free_port()}",
                        "--apiserver-protocol", protocol,
                        "--max-upstream-connections", str(WATCHES + 100)))
        wait_connected(gateway, fleet.alice)
        assert gateway.agent is not None
        pid = gateway.agent.pid

        async def run() -> tuple[int, float]:
            # Warm up the agent's paths (watches and their end) before the baseline.
            await close_all(await hold_watches(gateway, fleet.alice, 4))
            await asyncio.sleep(1)
            before = rss(pid)
            writers = await hold_watches(gateway, fleet.alice, WATCHES)
            await asyncio.sleep(3)  # settled: every watch idle at the apiserver
            after = rss(pid)
            await close_all(writers)
            return before, (after - before) / WATCHES

        before, per_watch = asyncio.run(run())
        print(f"\nagent --apiserver-protocol {protocol}: {WATCHES} idle watches, "
              f"RSS {before / 2**20:.1f} MiB before, {per_watch:.0f} bytes per watch")
        return per_watch
    finally:
        group.stop_all()


async def close_all(writers: list[asyncio.StreamWriter]) -> None:
    for writer in writers:
        writer.close()


def test_agent_rss_per_idle_watch_h2_vs_h1(fleet: Fleet) -> None:
    h2 = measure(fleet, "h2")
    h1 = measure(fleet, "h1")
    print(f"h2/h1 per watch: {h2:.0f} / {h1:.0f} bytes = {h2 / h1:.2f}")
    assert h2 < h1 / 2  # a stream, not a TLS connection
    if WATCHES >= 1000:  # below that, one arena the allocator adds is a large share of the sum
        assert h2 <= H2_GOAL
